/**
 * A dependency check's failure whose message is meant for the operator reading /readyz (for
 * example "the upstream refuses the internal credential"): it appears under `reasons`. Other
 * errors show only as "down", so a driver's message with addresses or SQL never reaches the body.
 * Its own module: the database code throws it, and the keys CLI, which loads that code, need not
 * load the ops server's HTTP framework with it.
 */
export class DependencyDown extends Error {
  override name = 'DependencyDown'
}

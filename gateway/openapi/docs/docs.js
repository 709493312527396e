/* global SwaggerUIBundle, window, document, fetch, URL */
// The docs page at /docs: Swagger UI (served by the gateway from swagger-ui-dist) on the
// document at /v1/openapi.json. "Try it out" defaults to the gateway serving this page; the
// document's production and staging servers stay selectable.
'use strict'
;(async function showDocs() {
  const target = document.getElementById('swagger-ui')
  const response = await fetch(new URL('v1/openapi.json', window.location.href), { headers: { accept: 'application/json' } })
  if (!response.ok) {
    target.textContent = `The OpenAPI document could not be loaded (HTTP ${response.status}); it is at /v1/openapi.json.`
    return
  }
  const spec = await response.json()
  spec.servers = [{ url: new URL('v1', window.location.href).href, description: 'This gateway' }, ...(spec.servers || [])]
  window.ui = SwaggerUIBundle({
    spec,
    dom_id: '#swagger-ui',
    deepLinking: true,
    // No call to the public validator badge service: the page stays offline.
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: 'BaseLayout',
    docExpansion: 'list',
    displayRequestDuration: true,
    persistAuthorization: false,
  })
})()

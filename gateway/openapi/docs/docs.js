/* global SwaggerUIBundle, window, document, fetch, URL */
// The docs page at /docs: Swagger UI (served by the gateway from swagger-ui-dist) on the
// document at /v1/openapi.json. "Try it out" calls the gateway serving this page, the one server
// a page may call: the API offers no CORS (its keys are secrets, for servers, not for pages).
'use strict'
;(async function showDocs() {
  const target = document.getElementById('swagger-ui')
  const response = await fetch(new URL('v1/openapi.json', window.location.href), { headers: { accept: 'application/json' } })
  if (!response.ok) {
    target.textContent = `The OpenAPI document could not be loaded (HTTP ${response.status}); it is at /v1/openapi.json.`
    return
  }
  const spec = await response.json()
  spec.servers = [{ url: new URL('v1', window.location.href).href, description: 'This gateway' }]
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

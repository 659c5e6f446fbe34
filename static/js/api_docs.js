// The API page (templates/runs/api_docs.html): Swagger UI over /api/openapi.json, authorized with
// the user's bearer token, so that "Try it out" calls the API as a script does and the curl lines
// it shows need nothing else (no session cookie, no X-CSRFToken header).
(function () {
  const root = document.getElementById("swagger-ui");
  const settings = JSON.parse(document.getElementById("swagger-settings").textContent);
  settings.dom_id = "#swagger-ui";
  settings.presets = [SwaggerUIBundle.presets.apis];
  settings.onComplete = () => ui.preauthorizeApiKey("BearerToken", root.dataset.token);
  const ui = SwaggerUIBundle(settings);
})();

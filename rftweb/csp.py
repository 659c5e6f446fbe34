"""The Content-Security-Policy header (Django 5.2 has no CSP of its own; 6.0 adds one).

Every script the pages run is a file of this site (the templates hold no inline script or event
handler; `json_script` blocks are data, which CSP does not run), so an injected <script> or
onerror= runs nowhere. Styles allow 'unsafe-inline': templates set style attributes and Plotly
injects its own <style>, and a style cannot run code."""

from django.conf import settings


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        return response

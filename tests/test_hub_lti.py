"""The login from a learning platform, end to end: a "platform" this test runs on loopback
launches learners into the hub (PARLAB_HUB_LOGIN=lti13, then lti11), and Chromium lands in
that learner's JupyterLab (`make test-hub`).

The platform signs its launches itself, by the specifications, not with the authenticator's
libraries: LTI 1.3 (IMS Security Framework 1.0, section 5.1.1: the OIDC third-party login)
with an RSA key pair whose public half it serves as a JWKS: Chromium opens the platform's
launch page, which posts the login initiation to the hub; the hub sends the browser to the
platform's authorization end point with a state and a nonce; the platform posts back an
id_token (RS256, signed here with `cryptography`) with LTI's claims and the custom claim
username=<login>. LTI 1.1 (LTI 1.1.1 implementation guide, section 4: OAuth 1.0a body
signing): the launch's form fields signed with HMAC-SHA1 under the shared secret, the base
string made here by RFC 5849 section 3.4.

The class list (roster.json in the course root, as `make hub-roster` writes it) holds ann,
with platform id "u-5c1" and ben (platform id "u-9b7") and the retired cy. LTI 1.3 names the
learner by the custom username (ann lands in /user/ann/lab); LTI 1.1 by the platform's opaque
user_id (PARLAB_HUB_LTI_USERNAME=user_id), which the hub's gate maps to the class list's id: ben
lands in /user/ben/lab, and the hub has no user "u-9b7". Refused: cy (retired, a page saying
so), an id_token signed by another key, an LTI 1.1 launch signed with another secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_hub_e2e import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, Hub, free_ports, running_hub

from parlab.hub.roster import Roster, Student

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1",
                       reason="the hub's end-to-end tests run with `make test-hub`"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM} (make browser)"),
]
if os.environ.get("PARLAB_TEST_HUB") == "1":  # only the hub's venv has `cryptography`
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
CLIENT_ID, KEY, SECRET = "parlab-tool", "parlab-key", "s3cret-shared-with-the-platform"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def pct(text: str) -> str:
    """RFC 5849 section 3.6: percent-encode all but unreserved characters."""
    return urllib.parse.quote(text, safe="-._~")


def sign_lti11(url: str, fields: dict[str, str], secret: str) -> dict[str, str]:
    """The fields with oauth_* added and signed: HMAC-SHA1 over RFC 5849's base string."""
    fields = {**fields, "oauth_consumer_key": KEY, "oauth_nonce": uuid.uuid4().hex,
              "oauth_signature_method": "HMAC-SHA1", "oauth_timestamp": str(int(time.time())),
              "oauth_version": "1.0", "oauth_callback": "about:blank"}
    pairs = sorted((pct(k), pct(v)) for k, v in fields.items())
    base = "&".join(["POST", pct(url), pct("&".join(f"{k}={v}" for k, v in pairs))])
    digest = hmac.new(f"{pct(secret)}&".encode(), base.encode(), hashlib.sha1).digest()
    return {**fields, "oauth_signature": base64.b64encode(digest).decode()}


class Platform:
    """A learning platform on loopback: launch pages, the OIDC authorization end point, the
    JWKS; its users by login: (platform user id, roles)."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sign_with_other = False
        self.port = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.hub_url = ""
        self.lti11_secret = SECRET
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())

    def jwks(self) -> dict:
        numbers = self.key.public_key().public_numbers()
        as_bytes = lambda n: n.to_bytes((n.bit_length() + 7) // 8, "big")  # noqa: E731
        return {"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
                          "n": b64url(as_bytes(numbers.n)), "e": b64url(as_bytes(numbers.e))}]}

    def id_token(self, login: str, nonce: str) -> str:
        now, lti = int(time.time()), "https://purl.imsglobal.org/spec/lti/claim"
        claims = {
            "iss": self.url, "aud": CLIENT_ID, "sub": f"sub-{login}", "iat": now,
            "exp": now + 300, "nonce": nonce, "name": login,
            f"{lti}/message_type": "LtiResourceLinkRequest",
            f"{lti}/version": "1.3.0",
            f"{lti}/deployment_id": "1",
            f"{lti}/target_link_uri": f"{self.hub_url}/hub/spawn",
            f"{lti}/resource_link": {"id": "parlab-link"},
            f"{lti}/roles": [
                "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"],
            f"{lti}/custom": {"username": login}}
        head = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "k1"}).encode())
        body = b64url(json.dumps(claims).encode())
        key = self.other_key if self.sign_with_other else self.key
        signature = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{b64url(signature)}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def reply(self, body: str, kind: str = "text/html") -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlparse(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                hub = platform.hub_url
                if url.path == "/jwks":
                    self.reply(json.dumps(platform.jwks()), "application/json")
                elif url.path == "/launch13":          # the learner clicks the course's link
                    self.reply(autopost(f"{hub}/hub/lti13/oauth_login", {
                        "iss": platform.url, "login_hint": query["user"],
                        "target_link_uri": f"{hub}/hub/spawn", "client_id": CLIENT_ID,
                        "lti_message_hint": "parlab-link", "lti_deployment_id": "1"}))
                elif url.path == "/auth":               # the OIDC authorization end point
                    assert query["client_id"] == CLIENT_ID and query["scope"] == "openid"
                    assert query["response_mode"] == "form_post", query
                    self.reply(autopost(query["redirect_uri"], {
                        "id_token": platform.id_token(query["login_hint"], query["nonce"]),
                        "state": query["state"]}))
                elif url.path == "/launch11":
                    launch = f"{hub}/hub/lti/launch"
                    self.reply(autopost(launch, sign_lti11(launch, {
                        "lti_message_type": "basic-lti-launch-request", "lti_version": "LTI-1p0",
                        "resource_link_id": "parlab-link", "user_id": query["user"],
                        "roles": "Learner", "custom_next": "/hub/spawn"},
                        platform.lti11_secret)))
                else:
                    self.send_error(404)

        return Handler

    def __enter__(self) -> Platform:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def autopost(action: str, fields: dict[str, str]) -> str:
    """A page that posts `fields` to `action` at once, as platforms launch tools."""
    inputs = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                     for k, v in fields.items())
    return (f'<html><body><form id="f" method="post" action="{html.escape(action)}">{inputs}'
            '</form><script>document.getElementById("f").submit()</script></body></html>')


def class_list(root: Path) -> None:
    """roster.json as `make hub-roster` leaves it: ann and ben active, cy retired."""
    roster = Roster.load(root)
    roster.students = {"ann": Student("ann", "Ann", "Lee", lms_user_id="u-5c1"),
                       "ben": Student("ben", "Ben", "Okafor", lms_user_id="u-9b7"),
                       "cy": Student("cy", "Cy", "Twombly", lms_user_id="u-3d2",
                                     status="retired", since="2026-03-01T00:00:00+00:00")}
    roster.save()


def lands_in_lab(hub: Hub, launch: str, user: str, name: str) -> None:
    """Chromium opens the platform's launch page and ends in `user`'s JupyterLab."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        try:
            page.goto(launch)
            page.wait_for_url(f"**/user/{user}/lab**", timeout=120_000)
            page.wait_for_selector(".jp-LabShell", timeout=120_000)
            page.get_by_text("00_collectives").first.wait_for(timeout=60_000)  # their workspace
            page.screenshot(path=ARTIFACTS / f"{name}.png")
        except Exception:
            page.screenshot(path=ARTIFACTS / f"{name}-failure.png")
            raise
        finally:
            browser.close()


def refused_page(launch: str) -> str:
    """The text of the page Chromium ends on after the platform's launch page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        try:
            page.goto(launch)
            page.wait_for_load_state("networkidle", timeout=60_000)
            return page.inner_text("body")
        finally:
            browser.close()


@pytest.fixture
def platform() -> Iterator[Platform]:
    with Platform() as started:
        yield started


def test_lti13_launch_lands_in_the_learners_lab(tmp_path, monkeypatch, platform):
    class_list(tmp_path)
    monkeypatch.setenv("PARLAB_COURSE_ROOT", str(tmp_path))
    with running_hub(tmp_path, LOGIN="lti13", LTI_ISSUER=platform.url,
                     LTI_CLIENT_ID=CLIENT_ID, LTI_AUTHORIZE_URL=f"{platform.url}/auth",
                     LTI_JWKS_URL=f"{platform.url}/jwks") as hub:
        platform.hub_url = hub.base
        lands_in_lab(hub, f"{platform.url}/launch13?user=ann", "ann", "lti13-ann")
        assert hub.api("GET", "/hub/api/users/ann")["servers"][""]["ready"]
        said = refused_page(f"{platform.url}/launch13?user=cy")
        assert "cy was retired from this course's class list on 2026-03-01" in said, said
        platform.sign_with_other = True
        said = refused_page(f"{platform.url}/launch13?user=ben")
        assert "400" in said and "ben" not in [u["name"] for u in hub.api("GET", "/hub/api/users")]
        hub.api("DELETE", "/hub/api/users/ann/server")


def test_lti11_launch_maps_the_platform_id_to_the_class_list(tmp_path, monkeypatch, platform):
    class_list(tmp_path)
    monkeypatch.setenv("PARLAB_COURSE_ROOT", str(tmp_path))
    with running_hub(tmp_path, LOGIN="lti11", LTI_KEY=KEY, LTI_SECRET=SECRET,
                     LTI_USERNAME="user_id") as hub:
        platform.hub_url = hub.base
        lands_in_lab(hub, f"{platform.url}/launch11?user=u-9b7", "ben", "lti11-ben")
        users = {u["name"] for u in hub.api("GET", "/hub/api/users")}
        assert "ben" in users and "u-9b7" not in users, users
        platform.lti11_secret = "not-the-secret"
        said = refused_page(f"{platform.url}/launch11?user=u-5c1")
        assert "Invalid oauth_signature" in said or "401" in said, said
        hub.api("DELETE", "/hub/api/users/ben/server")

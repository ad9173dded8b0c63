"""A login from the learning platform: JupyterHub's LTI authenticator, from PARLAB_HUB_ settings.

jupyterhub-ltiauthenticator (pyproject's [hub] extra; 1.6 read and tested with JupyterHub
6.1: tests/test_hub_lti.py) turns the hub into an LTI tool: a learner clicks the course's link
in Canvas, Moodle, ... and lands in their own JupyterLab, no password. `configure_lti(c, ...)`
sets it from these settings (environment, as `make hub VAR=...` gives them):

    PARLAB_HUB_LOGIN = lti13 | lti11   (unset: the trial's shared password, or PAM)
  LTI 1.3, what the platform gives you when you register the tool:
    PARLAB_HUB_LTI_ISSUER          its issuer, e.g. https://moodle.example.edu
    PARLAB_HUB_LTI_CLIENT_ID       the client id(s) of the tool (a comma list)
    PARLAB_HUB_LTI_AUTHORIZE_URL   its OIDC authorization end point (Moodle
                                   <site>/mod/lti/auth.php, Canvas
                                   https://sso.canvaslms.com/api/lti/authorize_redirect)
    PARLAB_HUB_LTI_JWKS_URL        its public keys (Moodle <site>/mod/lti/certs.php, Canvas
                                   https://sso.canvaslms.com/api/lti/security/jwks)
    and what you give it: login initiation URL <hub>/hub/lti13/oauth_login, redirect URI
    <hub>/hub/lti13/oauth_callback, target link <hub>/hub/spawn (the hub prints them).
  LTI 1.1:
    PARLAB_HUB_LTI_KEY             the consumer key (default parlab)
    PARLAB_HUB_LTI_SECRET          the shared secret; unset: made once, kept in
                                   <run>/lti11_secret (readable by the hub alone), printed
    and the launch URL <hub>/hub/lti/launch, with the custom parameter next=/hub/spawn (the
    authenticator sends the learner on to it: their server, then JupyterLab).
  Both:
    PARLAB_HUB_LTI_USERNAME        which launch field names the learner (custom_username)

Which field names the learner, and why. The hub's user name must be the student's id of the
class list (`make hub-roster`: the nbgrader student and, under the system's users, the Unix
account), so that what they hand in is graded under the id the platform's gradebook knows.
The default is a custom parameter the tool's configuration on the platform sets,
`username=$User.username` (LTI's variable for the platform's login name; Canvas and Moodle
substitute it): the authenticator reads it as `custom_username` from an LTI 1.1 launch and from
the custom claim of an LTI 1.3 id_token alike. The login name is what the platforms' exports
hold (Canvas's SIS Login ID, Moodle's username), so the class list has it, and a login is a
valid Unix name. Not `sub` (LTI 1.3) or `user_id` (1.1): opaque per platform (Canvas's is a
UUID no export shows), though a class list with the platform's own id in an `id` column maps
it (parlab.hub.roster.LoginGate looks names up in `lms_user_id` first). Not
`lis_person_sourcedid`: LTI 1.3 nests it inside the lis claim, which the authenticator's
`username_key` cannot reach. Not the email: it changes, and is no Unix name. A launch without
the field falls back to `sub`/`user_id`, which the gate then refuses as not on the class list.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

__all__ = ["configure_lti", "LtiProblem", "LOGINS"]

LOGINS = ("lti13", "lti11")


class LtiProblem(ValueError):
    """The LTI settings are incomplete; the message names what to set."""


def _secret(run: Path) -> str:
    path = run / "lti11_secret"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def configure_lti(c: Any, login: str, given: dict[str, str], run: Path,
                  hub_url: str) -> list[str]:
    """Set the LTI authenticator of `login` on the config `c` from the settings `given`
    (issuer, client_id, authorize_url, jwks_url; key, secret; username: the module doc);
    the lines the hub prints (what to register on the platform)."""
    if login not in LOGINS:
        raise LtiProblem(f"PARLAB_HUB_LOGIN={login}: one of {', '.join(LOGINS)} (or unset)")
    username = given.get("username") or "custom_username"
    if login == "lti13":
        needed = ("issuer", "client_id", "authorize_url", "jwks_url")
        missing = [f"PARLAB_HUB_LTI_{k.upper()}" for k in needed if not given.get(k)]
        if missing:
            raise LtiProblem(f"PARLAB_HUB_LOGIN=lti13 needs {', '.join(missing)}: the platform "
                             "gives them when you register the hub as an LTI 1.3 tool "
                             "(autograder/hub/README.md, \"A login from the learning platform\")")
        c.JupyterHub.authenticator_class = "ltiauthenticator.lti13.auth.LTI13Authenticator"
        c.LTI13Authenticator.issuer = given["issuer"]
        c.LTI13Authenticator.client_id = {i.strip() for i in given["client_id"].split(",")
                                          if i.strip()}
        c.LTI13Authenticator.authorize_url = given["authorize_url"]
        c.LTI13Authenticator.jwks_endpoint = given["jwks_url"]
        c.LTI13Authenticator.username_key = username
        return [f"LTI 1.3 from {given['issuer']} (client {given['client_id']}): register "
                f"login initiation {hub_url}/hub/lti13/oauth_login, redirect "
                f"{hub_url}/hub/lti13/oauth_callback, target link {hub_url}/hub/spawn, custom "
                f"parameter username=$User.username (learners named by {username})"]
    key = given.get("key") or "parlab"
    secret = given.get("secret") or _secret(run)
    c.JupyterHub.authenticator_class = "ltiauthenticator.lti11.auth.LTI11Authenticator"
    c.LTI11Authenticator.consumers = {key: secret}
    c.LTI11Authenticator.username_key = username
    kept = "as PARLAB_HUB_LTI_SECRET" if given.get("secret") else run / "lti11_secret"
    return [f"LTI 1.1: launch URL {hub_url}/hub/lti/launch, consumer key {key}, secret {kept}"
            f", custom parameters username=$User.username (learners named by {username}) and "
            "next=/hub/spawn"]

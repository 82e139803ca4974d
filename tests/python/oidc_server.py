"""A local OpenID Connect token endpoint for tests/secured.rs: the client credentials grant
(RFC 6749 4.4) and the JSON Web Key Set its tokens are signed with, on a free loopback port.

    oidc_server.py CLIENT_ID:SECRET [CLIENT_ID:SECRET ...]

prints `http://127.0.0.1:PORT` once it listens, then serves until killed:

- GET  /jwks   the public key (RS256), for the Kafka node's OAUTHBEARER validator
- POST /token  grant_type=client_credentials, the client's id and secret in HTTP Basic
               (librdkafka's way) or in the form: a JWT with sub = the client id,
               aud = kafka, 5 minutes of validity
"""

import base64
import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from joserfc import jwt
from joserfc.jwk import RSAKey

CLIENTS = dict(arg.split(":", 1) for arg in sys.argv[1:])
KEY = RSAKey.generate_key(2048, parameters={"kid": "watchbridge-test", "use": "sig", "alg": "RS256"})
TOKENS_ISSUED = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        sys.stderr.write("oidc: " + fmt % args + "\n")

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/jwks":
            self.answer(200, {"keys": [KEY.as_dict(private=False)]})
        else:
            self.answer(404, {"error": "not_found"})

    def do_POST(self):
        global TOKENS_ISSUED
        if self.path != "/token":
            return self.answer(404, {"error": "not_found"})
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        client, secret = form.get("client_id", [None])[0], form.get("client_secret", [None])[0]
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            client, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
        if form.get("grant_type", [None])[0] != "client_credentials":
            return self.answer(400, {"error": "unsupported_grant_type"})
        if client not in CLIENTS or CLIENTS[client] != secret:
            return self.answer(401, {"error": "invalid_client"})
        now = int(time.time())
        claims = {"sub": client, "aud": "kafka", "iss": "watchbridge-test", "iat": now,
                  "exp": now + 300}
        # Kafka refuses an empty scope claim ("scope value must be non-empty"): only a
        # scope asked for is given.
        if form.get("scope", [""])[0]:
            claims["scope"] = form["scope"][0]
        token = jwt.encode({"alg": "RS256", "kid": "watchbridge-test"}, claims, KEY)
        TOKENS_ISSUED += 1
        self.answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": 300})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()

"""Interop between wanbake's model signatures and the reference tool, PyPI model-signing 1.1.1.

Run from the repository root after `cargo build --release`:

    python golden/signing/interop.py

What it does (everything under golden/signing/):
  keys/     test keys made with `cryptography` once (kept when present): P-256, P-384, P-521 in
            SEC1 and PKCS#8 PEM, their SPKI public keys, and an Ed25519 and an RSA key that
            wanbake must refuse.
  model/    a small folder (hidden file, empty file, component-order names, a top-level
            .github/ that both tools ignore), made once.
  py/       signatures made by `python -m model_signing sign key` (signature outside the
            folder); wanbake's tests check that `wanbake verify --public-key` accepts them.
  wanbake/  signatures made by `wanbake sign` over a copy of model/ (signature outside the
            folder), each accepted by `python -m model_signing verify key` before it is kept;
            wanbake's tests check that signing again gives the same bytes (RFC 6979).
  results.json  versions and the outcome of every run, both directions, and of the real
            tool's `verify key` on a demo release baked with `[sign] key`.
It exits non-zero if any run disagrees with the expectation.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WANBAKE = ROOT / "target" / "release" / "wanbake"
CURVES = {"p256": ec.SECP256R1(), "p384": ec.SECP384R1(), "p521": ec.SECP521R1()}
# (key file stem, curve) for every case run in both directions
CASES = [
    ("p256_sec1", "p256"),
    ("p256_pkcs8", "p256"),
    ("p384_sec1", "p384"),
    ("p384_pkcs8", "p384"),
    ("p521_pkcs8", "p521"),
]


def pem_private(key, fmt):
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def make_keys(d: Path):
    d.mkdir(exist_ok=True)
    for curve_name, curve in CURVES.items():
        if (d / f"{curve_name}_pkcs8.pem").exists():
            continue
        k = ec.generate_private_key(curve)
        (d / f"{curve_name}_sec1.pem").write_bytes(
            pem_private(k, serialization.PrivateFormat.TraditionalOpenSSL))
        (d / f"{curve_name}_pkcs8.pem").write_bytes(
            pem_private(k, serialization.PrivateFormat.PKCS8))
        (d / f"{curve_name}_pub.pem").write_bytes(k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    if not (d / "ed25519.pem").exists():
        k = ed25519.Ed25519PrivateKey.generate()
        (d / "ed25519.pem").write_bytes(pem_private(k, serialization.PrivateFormat.PKCS8))
        (d / "ed25519_pub.pem").write_bytes(k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    if not (d / "rsa.pem").exists():
        k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (d / "rsa.pem").write_bytes(pem_private(k, serialization.PrivateFormat.PKCS8))


def make_model(d: Path):
    if d.exists():
        return
    files = {
        "config.json": b'{"dim": 4}\n',
        "weights.bin": bytes(range(16)),
        ".hidden": b"hidden files are signed\n",
        "empty.txt": b"",
        "sub/readme.txt": b"hi\n",
        "a/b": b"a/b\n",
        "a-b": b"a-b\n",
        "a.b": b"a.b\n",
        "Z": b"Z\n",
        ".github/notes.txt": b"ignored by both tools\n",
    }
    for name, data in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return {"cmd": " ".join(str(c) for c in cmd), "rc": r.returncode,
            "out": (r.stdout + r.stderr).strip().splitlines()[-1:]}


def py_tool(*args):
    return [sys.executable, "-m", "model_signing", *args]


def main():
    if not WANBAKE.exists():
        sys.exit(f"{WANBAKE} is missing: run `cargo build --release` first")
    keys, model = HERE / "keys", HERE / "model"
    make_keys(keys)
    make_model(model)
    for sub in ("py", "wanbake"):
        (HERE / sub).mkdir(exist_ok=True)
    results = {
        "versions": {p: metadata.version(p) for p in
                     ("model-signing", "sigstore-models", "sigstore", "cryptography")},
        "python": sys.version.split()[0],
        "runs": [],
    }
    failures = []

    def record(kind, case, res, want_rc):
        res.update({"kind": kind, "case": case, "expected_rc": want_rc})
        results["runs"].append(res)
        if res["rc"] != want_rc:
            failures.append(res)

    with tempfile.TemporaryDirectory() as t:
        t = Path(t)
        for stem, curve in CASES:
            key = keys / f"{stem}.pem"
            pub = keys / f"{curve}_pub.pem"
            # reference signs, wanbake verifies
            py_sig = HERE / "py" / f"{stem}.sig"
            if not py_sig.exists():
                record("python sign", stem, run(py_tool(
                    "sign", "key", "model", "--private_key", key, "--signature", py_sig),
                    HERE), 0)
            record("wanbake verify python signature", stem, run(
                [WANBAKE, "verify", "model", "--public-key", pub, "--signature", py_sig],
                HERE), 0)
            # wanbake signs (outside the folder), reference verifies
            work = t / stem / "model"
            shutil.copytree(model, work)
            wb_sig = t / stem / f"{stem}.sig"
            record("wanbake sign", stem, run(
                [WANBAKE, "sign", work, "--key", key, "--signature", wb_sig], t), 0)
            record("python verify wanbake signature", stem, run(py_tool(
                "verify", "key", work, "--public_key", pub, "--signature", wb_sig), t), 0)
            if wb_sig.exists():
                shutil.copyfile(wb_sig, HERE / "wanbake" / f"{stem}.sig")
            # wanbake signs with the default DIR/model.sig, reference verifies
            record("wanbake sign (model.sig inside)", stem, run(
                [WANBAKE, "sign", work, "--key", key], t), 0)
            record("python verify wanbake model.sig", stem, run(py_tool(
                "verify", "key", work, "--public_key", pub, "--signature",
                work / "model.sig"), t), 0)
            # both refuse a changed folder
            (work / "sub" / "readme.txt").write_bytes(b"ho\n")
            record("python verify after a change", stem, run(py_tool(
                "verify", "key", work, "--public_key", pub, "--signature",
                work / "model.sig"), t), 1)
            record("wanbake verify after a change", stem, run(
                [WANBAKE, "verify", work, "--public-key", pub], t), 3)
    # a release baked with `[sign]` (the demo recipe, checks left out) verifies with the real tool
    with tempfile.TemporaryDirectory() as t:
        t = Path(t)
        text = (ROOT / "recipes" / "demo.toml").read_text()
        text = text[:text.find("[[check]]")].replace('"../', f'"{ROOT}/')
        text = text.replace(f'"{ROOT}/out/demo"', '"release"')
        key = keys / "p384_sec1.pem"
        (t / "demo.toml").write_text(text + f'\n[sign]\nkey = "{key}"\n')
        record("wanbake bake with [sign]", "p384_sec1", run([WANBAKE, "bake", "demo.toml"], t), 0)
        record("python verify baked release", "p384_sec1", run(py_tool(
            "verify", "key", t / "release", "--public_key", keys / "p384_pub.pem",
            "--signature", t / "release" / "model.sig"), t), 0)
    # the real tool itself refuses other key types (wanbake's tests check that wanbake does)
    for stem in ("ed25519", "rsa"):
        with tempfile.TemporaryDirectory() as t:
            record("python sign with a refused key", stem, run(py_tool(
                "sign", "key", model, "--private_key", keys / f"{stem}.pem", "--signature",
                Path(t) / "x.sig"), HERE), 1)
    for r in results["runs"]:
        r["cmd"] = r["cmd"].replace(str(HERE) + os.sep, "").replace(str(ROOT) + os.sep, "")
        r["cmd"] = " ".join("TMP/" + w.split("/", 4)[-1] if w.startswith("/tmp/") else w
                            for w in r["cmd"].split())
        r["out"] = [o.replace(str(HERE) + os.sep, "") for o in r["out"]]
        r["out"] = [" ".join("TMP" if "/tmp/" in w else w for w in o.split()) for o in r["out"]]
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{len(results['runs'])} runs, {len(failures)} failures")
    for f in failures:
        print("FAILED:", json.dumps(f))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

//! ECDSA keys for model signing: loading PEM private keys (PKCS#8 or SEC1) and public keys
//! (SubjectPublicKeyInfo), the key hint, and signing / verifying bytes with the curve's own
//! hash (P-256 → SHA-256, P-384 → SHA-384, P-521 → SHA-512; `spec/model_signing.md` §3).
//!
//! Owns: which key types are accepted (ECDSA on the three NIST curves, named-curve
//! parameters) and the refusal of everything else with a message that says what was found.
//! Signatures are deterministic (RFC 6979 nonces) and DER-encoded. Does not own: what is
//! signed (`statement`, `bundle`).

use ecdsa::signature::{self, Signer, Verifier};
use pkcs8::der::asn1::ObjectIdentifier;
use pkcs8::der::{Decode, pem};
use pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
use sha2::{Digest, Sha256};
use spki::DecodePublicKey;

const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_P521: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.35");
const OID_SECP256K1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.10");
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_ED448: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.113");
const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const OID_RSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");

const SUPPORTED: &str = "model signing (key mode) takes ECDSA keys on P-256, P-384 or P-521, \
     e.g. `openssl ecparam -name prime256v1 -genkey -noout -out key.pem`";

/// Why a key could not be used. `what` names the file as the caller chose to show it.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct KeyError {
    /// The key file as shown to the user.
    pub what: String,
    /// What is wrong, and what is accepted instead.
    pub problem: String,
}

/// The curve of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    /// NIST P-256 (secp256r1), signed with SHA-256.
    P256,
    /// NIST P-384 (secp384r1), signed with SHA-384.
    P384,
    /// NIST P-521 (secp521r1), signed with SHA-512.
    P521,
}

impl Curve {
    /// The curve's name as OpenSSL and the spec spell it.
    pub fn name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
            Curve::P521 => "P-521",
        }
    }
}

/// A private signing key.
pub enum SigningKey {
    /// P-256.
    P256(p256::ecdsa::SigningKey),
    /// P-384.
    P384(p384::ecdsa::SigningKey),
    /// P-521.
    P521(p521::ecdsa::SigningKey),
}

/// A public verification key.
#[derive(Clone, Debug)]
pub enum VerifyingKey {
    /// P-256.
    P256(p256::ecdsa::VerifyingKey),
    /// P-384.
    P384(p384::ecdsa::VerifyingKey),
    /// P-521.
    P521(p521::ecdsa::VerifyingKey),
}

fn key_err(what: &str, problem: impl Into<String>) -> KeyError {
    KeyError {
        what: what.to_string(),
        problem: problem.into(),
    }
}

fn curve_of(
    what: &str,
    alg: ObjectIdentifier,
    params: Option<ObjectIdentifier>,
) -> Result<Curve, KeyError> {
    let kind = match alg {
        OID_EC_PUBLIC_KEY => None,
        OID_ED25519 => Some("an Ed25519 key"),
        OID_ED448 => Some("an Ed448 key"),
        OID_RSA | OID_RSA_PSS => Some("an RSA key"),
        _ => Some("a key of an unknown algorithm"),
    };
    if let Some(kind) = kind {
        return Err(key_err(
            what,
            format!("found {kind} (algorithm {alg}); {SUPPORTED}"),
        ));
    }
    match params {
        Some(OID_P256) => Ok(Curve::P256),
        Some(OID_P384) => Ok(Curve::P384),
        Some(OID_P521) => Ok(Curve::P521),
        Some(OID_SECP256K1) => Err(key_err(
            what,
            format!("found an ECDSA key on secp256k1; {SUPPORTED}"),
        )),
        Some(o) => Err(key_err(
            what,
            format!("found an ECDSA key on curve {o}; {SUPPORTED}"),
        )),
        None => Err(key_err(
            what,
            format!("found an ECDSA key without a named curve; {SUPPORTED}"),
        )),
    }
}

fn decode_pem<'a>(what: &str, text: &'a [u8]) -> Result<(&'a str, Vec<u8>), KeyError> {
    // A passphrase-protected key (OpenSSL's legacy `Proc-Type: 4,ENCRYPTED` headers, or
    // PKCS#8 `ENCRYPTED PRIVATE KEY`): say so, and how to get a key wanbake reads.
    let encrypted = |marker: &[u8]| text.windows(marker.len()).any(|w| w == marker);
    if encrypted(b"Proc-Type: 4,ENCRYPTED") || encrypted(b"BEGIN ENCRYPTED PRIVATE KEY") {
        return Err(key_err(
            what,
            "the key is encrypted (passphrase-protected); wanbake reads unencrypted keys: \
             decrypt a copy with `openssl pkey -in KEY -out KEY.plain.pem` and keep it as \
             private as the original"
                .to_string(),
        ));
    }
    pem::decode_vec(text)
        .map_err(|e| key_err(what, format!("not a PEM key file ({e}); {SUPPORTED}")))
}

impl SigningKey {
    /// Reads a PEM private key: PKCS#8 (`BEGIN PRIVATE KEY`) or SEC1 (`BEGIN EC PRIVATE
    /// KEY`). `what` is how errors name the key (never its bytes).
    pub fn from_pem(what: &str, text: &[u8]) -> Result<SigningKey, KeyError> {
        let (label, der) = decode_pem(what, text)?;
        let bad = |e: &dyn std::fmt::Display| key_err(what, format!("cannot read the key: {e}"));
        match label {
            "PRIVATE KEY" => {
                let info = pkcs8::PrivateKeyInfoRef::from_der(&der).map_err(|e| bad(&e))?;
                let params = info.algorithm.parameters_oid().ok();
                match curve_of(what, info.algorithm.oid, params)? {
                    Curve::P256 => p256::ecdsa::SigningKey::from_pkcs8_der(&der)
                        .map(SigningKey::P256)
                        .map_err(|e| bad(&e)),
                    Curve::P384 => p384::ecdsa::SigningKey::from_pkcs8_der(&der)
                        .map(SigningKey::P384)
                        .map_err(|e| bad(&e)),
                    Curve::P521 => p521::ecdsa::SigningKey::from_pkcs8_der(&der)
                        .map(SigningKey::P521)
                        .map_err(|e| bad(&e)),
                }
            }
            "EC PRIVATE KEY" => {
                let key = sec1::EcPrivateKey::from_der(&der).map_err(|e| bad(&e))?;
                let params = key.parameters.and_then(|p| p.named_curve());
                match curve_of(what, OID_EC_PUBLIC_KEY, params)? {
                    Curve::P256 => p256::SecretKey::from_sec1_der(&der)
                        .map(|k| SigningKey::P256(k.into()))
                        .map_err(|e| bad(&e)),
                    Curve::P384 => p384::SecretKey::from_sec1_der(&der)
                        .map(|k| SigningKey::P384(k.into()))
                        .map_err(|e| bad(&e)),
                    Curve::P521 => p521::SecretKey::from_sec1_der(&der)
                        .map(|k| SigningKey::P521(k.into()))
                        .map_err(|e| bad(&e)),
                }
            }
            "ENCRYPTED PRIVATE KEY" => Err(key_err(
                what,
                "the key is encrypted; decrypt it first (`openssl pkey -in KEY -out PLAIN`)",
            )),
            "RSA PRIVATE KEY" => Err(key_err(what, format!("found an RSA key; {SUPPORTED}"))),
            "OPENSSH PRIVATE KEY" => {
                Err(key_err(what, format!("found an OpenSSH key; {SUPPORTED}")))
            }
            "PUBLIC KEY" => Err(key_err(
                what,
                "this is a public key; signing needs the private key",
            )),
            other => Err(key_err(
                what,
                format!(
                    "expected `BEGIN PRIVATE KEY` or `BEGIN EC PRIVATE KEY`, found `BEGIN {other}`"
                ),
            )),
        }
    }

    /// The matching public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        match self {
            SigningKey::P256(k) => VerifyingKey::P256(*k.verifying_key()),
            SigningKey::P384(k) => VerifyingKey::P384(*k.verifying_key()),
            SigningKey::P521(k) => VerifyingKey::P521(*k.verifying_key()),
        }
    }

    /// Signs `msg` (hashed with the curve's hash, RFC 6979 nonce) and returns the DER
    /// signature.
    pub fn sign_der(&self, msg: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::P256(k) => {
                let s: p256::ecdsa::Signature = k.sign(msg);
                s.to_der().as_bytes().to_vec()
            }
            SigningKey::P384(k) => {
                let s: p384::ecdsa::Signature = k.sign(msg);
                s.to_der().as_bytes().to_vec()
            }
            SigningKey::P521(k) => {
                let s: p521::ecdsa::Signature = k.sign(msg);
                s.to_der().as_bytes().to_vec()
            }
        }
    }
}

impl VerifyingKey {
    /// Reads a PEM public key (`BEGIN PUBLIC KEY`, SubjectPublicKeyInfo).
    pub fn from_pem(what: &str, text: &[u8]) -> Result<VerifyingKey, KeyError> {
        let (label, der) = decode_pem(what, text)?;
        if label != "PUBLIC KEY" {
            return Err(key_err(
                what,
                format!("expected `BEGIN PUBLIC KEY`, found `BEGIN {label}`"),
            ));
        }
        let bad = |e: &dyn std::fmt::Display| key_err(what, format!("cannot read the key: {e}"));
        let info = spki::SubjectPublicKeyInfoRef::from_der(&der).map_err(|e| bad(&e))?;
        let params = info.algorithm.parameters_oid().ok();
        match curve_of(what, info.algorithm.oid, params)? {
            Curve::P256 => p256::ecdsa::VerifyingKey::from_public_key_der(&der)
                .map(VerifyingKey::P256)
                .map_err(|e| bad(&e)),
            Curve::P384 => p384::ecdsa::VerifyingKey::from_public_key_der(&der)
                .map(VerifyingKey::P384)
                .map_err(|e| bad(&e)),
            Curve::P521 => p521::ecdsa::VerifyingKey::from_public_key_der(&der)
                .map(VerifyingKey::P521)
                .map_err(|e| bad(&e)),
        }
    }

    /// The curve.
    pub fn curve(&self) -> Curve {
        match self {
            VerifyingKey::P256(_) => Curve::P256,
            VerifyingKey::P384(_) => Curve::P384,
            VerifyingKey::P521(_) => Curve::P521,
        }
    }

    /// The canonical SubjectPublicKeyInfo PEM (uncompressed point, 64-column lines, `\n`).
    pub fn canonical_pem(&self) -> String {
        let pem = match self {
            VerifyingKey::P256(k) => k.to_public_key_pem(LineEnding::LF),
            VerifyingKey::P384(k) => k.to_public_key_pem(LineEnding::LF),
            VerifyingKey::P521(k) => k.to_public_key_pem(LineEnding::LF),
        };
        // Encoding a valid key into PEM cannot fail (no size limits are reached).
        pem.unwrap_or_default()
    }

    /// The key hint of the bundle: lowercase hex SHA-256 of the canonical PEM (§3).
    pub fn hint(&self) -> String {
        crate::io::digest::hex(&Sha256::digest(self.canonical_pem().as_bytes()))
    }

    /// Checks a DER signature over `msg`. High-S signatures are accepted (OpenSSL makes them).
    pub fn verify_der(&self, msg: &[u8], der: &[u8]) -> Result<(), String> {
        let bad = |e: signature::Error| format!("the signature does not verify ({e})");
        let not_der = |e: signature::Error| format!("the signature is not DER-encoded ECDSA ({e})");
        match self {
            VerifyingKey::P256(k) => {
                let s = p256::ecdsa::Signature::from_der(der).map_err(not_der)?;
                k.verify(msg, &s).map_err(bad)
            }
            VerifyingKey::P384(k) => {
                let s = p384::ecdsa::Signature::from_der(der).map_err(not_der)?;
                k.verify(msg, &s).map_err(bad)
            }
            VerifyingKey::P521(k) => {
                let s = p521::ecdsa::Signature::from_der(der).map_err(not_der)?;
                k.verify(msg, &s).map_err(bad)
            }
        }
    }
}

//! The signature file: a Sigstore bundle v0.3 holding a DSSE envelope (`spec/model_signing.md`
//! §6-7), and the DSSE pre-authentication encoding (PAE) that is actually signed.
//!
//! Owns: writing the bundle exactly as the reference tool does (compact JSON, fixed key
//! order, padded standard base64, `tlogEntries: []`, `keyid: ""`) and reading it as strictly
//! as the reference reader (unknown fields refused, strict JSON types, padded base64 only).
//! Does not own: the statement inside the payload (`statement`) or keys (`keys`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The only bundle media type the key verifier accepts.
pub const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// DSSE v1 PAE: `DSSEv1 <len(type)> <type> <len(payload)> <payload>` (lengths in bytes).
pub fn pae(payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {PAYLOAD_TYPE} {} ",
        PAYLOAD_TYPE.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    verification_material: VerificationMaterial,
    dsse_envelope: Envelope,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VerificationMaterial {
    public_key: PublicKeyId,
    #[serde(default)]
    tlog_entries: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PublicKeyId {
    #[serde(default)]
    hint: Option<String>,
    /// Tolerated on read because the reference reader deletes it before validation.
    #[serde(rename = "rawBytes", default, skip_serializing)]
    _raw_bytes: Option<serde_json::Value>,
    /// Tolerated on read for the same reason.
    #[serde(rename = "keyDetails", default, skip_serializing)]
    _key_details: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<EnvSignature>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvSignature {
    sig: String,
    #[serde(default)]
    keyid: Option<String>,
}

/// A parsed bundle: what the verifier needs, decoded.
#[derive(Debug)]
pub struct ParsedBundle {
    /// The key hint; `None` when absent or empty.
    pub hint: Option<String>,
    /// The statement bytes exactly as stored (decoded from base64).
    pub payload: Vec<u8>,
    /// `dsseEnvelope.payloadType`.
    pub payload_type: String,
    /// The first signature, DER bytes (only the first is verified, as the reference does).
    pub signature: Vec<u8>,
}

/// The bundle bytes for a signed payload: compact JSON, no trailing newline.
pub fn write(hint: &str, payload: &[u8], signature_der: &[u8]) -> Vec<u8> {
    let b = Bundle {
        media_type: MEDIA_TYPE.into(),
        verification_material: VerificationMaterial {
            public_key: PublicKeyId {
                hint: Some(hint.into()),
                _raw_bytes: None,
                _key_details: None,
            },
            tlog_entries: Vec::new(),
        },
        dsse_envelope: Envelope {
            payload: STANDARD.encode(payload),
            payload_type: PAYLOAD_TYPE.into(),
            signatures: vec![EnvSignature {
                sig: STANDARD.encode(signature_der),
                keyid: Some(String::new()),
            }],
        },
    };
    // Plain strings and vectors always serialise.
    serde_json::to_vec(&b).unwrap_or_default()
}

/// Parses bundle bytes strictly; the error says what is wrong (not the file name).
pub fn parse(bytes: &[u8]) -> Result<ParsedBundle, String> {
    let b: Bundle =
        serde_json::from_slice(bytes).map_err(|e| format!("not a valid signature bundle: {e}"))?;
    if b.media_type != MEDIA_TYPE {
        return Err(format!(
            "mediaType `{}`, expected `{MEDIA_TYPE}`",
            b.media_type
        ));
    }
    if !b.verification_material.tlog_entries.is_empty() {
        return Err(
            "the bundle carries transparency log entries; only offline key signatures \
             (`tlogEntries: []`) are supported"
                .into(),
        );
    }
    let payload = STANDARD
        .decode(&b.dsse_envelope.payload)
        .map_err(|e| format!("dsseEnvelope.payload is not padded standard base64: {e}"))?;
    let first = b
        .dsse_envelope
        .signatures
        .first()
        .ok_or("dsseEnvelope.signatures is empty")?;
    let signature = STANDARD.decode(&first.sig).map_err(|e| {
        format!("dsseEnvelope.signatures[0].sig is not padded standard base64: {e}")
    })?;
    Ok(ParsedBundle {
        hint: b
            .verification_material
            .public_key
            .hint
            .filter(|h| !h.is_empty()),
        payload,
        payload_type: b.dsse_envelope.payload_type,
        signature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_v1_layout() {
        assert_eq!(
            pae(b"{}"),
            b"DSSEv1 28 application/vnd.in-toto+json 2 {}".to_vec()
        );
    }

    #[test]
    fn write_then_parse_round_trips_and_unknown_fields_are_refused() {
        let bytes = write("ab", b"{\"x\":1}", &[1, 2, 3]);
        let p = parse(&bytes).unwrap();
        assert_eq!(p.hint.as_deref(), Some("ab"));
        assert_eq!(p.payload, b"{\"x\":1}");
        assert_eq!(p.signature, vec![1, 2, 3]);
        let text = String::from_utf8(bytes).unwrap();
        let extra = text.replacen("{\"mediaType\"", "{\"x\":1,\"mediaType\"", 1);
        assert!(
            parse(extra.as_bytes())
                .unwrap_err()
                .contains("unknown field")
        );
        let unpadded = text.replace("AQID", "AQI");
        assert!(parse(unpadded.as_bytes()).is_err());
    }
}

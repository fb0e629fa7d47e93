//! `[sign]` in a recipe: the release is signed (an OpenSSF model-signing bundle,
//! `model.sig`) on the temporary directory after bake's own verify of it and before the
//! commit, so a signed release appears atomically or not at all.
//!
//! Owns: loading the recipe's key before anything is written, what the manifest records
//! about it (`options.sign`: the public key's hint, curve and signature name; never the
//! private key's path or bytes), and the verify-then-sign step. Does not own: the format
//! (`signing`).

use std::path::Path;

use crate::io::ReadError;
use crate::recipe::Recipe;
use crate::release::manifest::{Manifest, verify_committed};
use crate::signing::{self, SIGNATURE_NAME, SigningKey};

use super::BakeError;

/// The recipe's signing key, loaded.
pub struct Signer {
    key: SigningKey,
}

/// How errors name the key: the recipe field, never the file (its path is not shown).
const SHOWN: &str = "recipe [sign] key";

/// Loads `[sign] key` when the recipe has one. Errors name the recipe and the field only.
pub fn load(recipe: &Recipe) -> Result<Option<Signer>, BakeError> {
    let Some(spec) = &recipe.sign else {
        return Ok(None);
    };
    let bytes = std::fs::read(&spec.key).map_err(|e| {
        BakeError::recipe(
            recipe,
            "sign.key",
            format!("cannot read the key file: {}", e.kind()),
        )
    })?;
    let key = SigningKey::from_pem(SHOWN, &bytes)
        .map_err(|e| BakeError::recipe(recipe, "sign.key", e.problem))?;
    Ok(Some(Signer { key }))
}

impl Signer {
    /// The manifest's `options.sign`.
    pub fn record(&self) -> serde_json::Value {
        let vk = self.key.verifying_key();
        serde_json::json!({
            "format": "OpenSSF model signing v1.0, key mode (model_signing verify key)",
            "signature": SIGNATURE_NAME,
            "curve": vk.curve().name(),
            "key_hint": vk.hint(),
        })
    }

    /// Checks the staged release against its manifest, then signs it with the digests of
    /// that manifest, naming the subject `name` (the release's final folder name). The seal
    /// has just hashed every staged file, from the bytes written, to make that manifest, so
    /// the check here is the listing and the sizes (`release::manifest::verify_committed`), not a read.
    pub fn sign_staged(&self, tmp: &Path, name: &str) -> Result<(), BakeError> {
        let mpath = tmp.join(crate::io::checkpoint::MANIFEST_NAME);
        let bytes = fs_err::read(&mpath).map_err(|e| ReadError::io(&mpath, e))?;
        let report = verify_committed(tmp, &bytes)?;
        if !report.ok() {
            let what: Vec<String> = report
                .mismatches
                .iter()
                .take(5)
                .map(|m| format!("{}: {}", m.path, m.what))
                .collect();
            return Err(BakeError::NotSigned {
                reason: format!("the staged release does not verify: {}", what.join("; ")),
            });
        }
        let manifest = Manifest::from_bytes(&bytes).map_err(BakeError::Internal)?;
        signing::sign_named(
            tmp,
            &tmp.join(SIGNATURE_NAME),
            name,
            &self.key,
            Some(&manifest),
        )?;
        Ok(())
    }
}

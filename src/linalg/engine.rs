//! Which SVD engine computed a set of LoRA-XS bases: the fact an SVD cache entry is keyed by,
//! and the merge report (so the manifest) records.
//!
//! Owns: [`SvdEngine`] and its one spelling ([`SvdEngine::id`]). Does not own: the SVDs
//! (`linalg::svd` on faer, `gpu::svd` on cuSOLVER), the cache (`linalg::cache`), which route
//! uses which engine (`pipeline::Compute::svd_engine`).
//!
//! Two engines give bases that differ in a few elements by about one f32 ulp (BENCHMARKS.md
//! "GPU"), and each is deterministic only under its own conditions: faer's bits hold for one
//! faer version and [`SVD_PARTITION_DEGREE`] on any machine; cuSOLVER's, by NVIDIA's
//! reproducibility terms, for one cuSOLVER version, GPU architecture and SM count. The id
//! names all of them, so a cache entry is never read by a run whose engine could have given
//! other bits.

use super::svd::SVD_PARTITION_DEGREE;

/// faer's version, as Cargo.lock pins it (`tests/linalg.rs` holds this to the lock file).
pub const FAER_VERSION: &str = "0.24.4";

/// cuSOLVER's routine behind the device route's bases (`gpu::svd`).
pub const CUSOLVER_ROUTINE: &str = "cusolverDnDgesvd";

/// The engine of a set of -xs bases.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SvdEngine {
    /// faer's thin SVD in f64 (`linalg::xs_bases`): the reference engine, the same bits on
    /// every machine.
    Faer,
    /// cuSOLVER's [`CUSOLVER_ROUTINE`] in f64 on one GPU.
    Cusolver {
        /// `cusolverGetVersion`: 1000·major + 100·minor + patch.
        version: i32,
        /// Compute capability (major, minor).
        arch: (i32, i32),
        /// Streaming multiprocessors.
        sms: i32,
    },
}

impl SvdEngine {
    /// The one spelling, in cache keys and entries, reports and manifests.
    pub fn id(&self) -> String {
        match self {
            SvdEngine::Faer => format!(
                "faer {FAER_VERSION} thin SVD, f64, partition degree {SVD_PARTITION_DEGREE}"
            ),
            SvdEngine::Cusolver { version, arch, sms } => format!(
                "cuSOLVER {}.{}.{} {CUSOLVER_ROUTINE}, f64, sm_{}{}, {sms} SMs",
                version / 1000,
                version % 1000 / 100,
                version % 100,
                arch.0,
                arch.1
            ),
        }
    }
}

impl std::fmt::Display for SvdEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id())
    }
}

impl serde::Serialize for SvdEngine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_everything_the_bits_depend_on() {
        assert_eq!(
            SvdEngine::Faer.id(),
            "faer 0.24.4 thin SVD, f64, partition degree 16"
        );
        let gpu = SvdEngine::Cusolver {
            version: 12_004,
            arch: (9, 0),
            sms: 132,
        };
        assert_eq!(
            gpu.id(),
            "cuSOLVER 12.0.4 cusolverDnDgesvd, f64, sm_90, 132 SMs"
        );
        let other = |version, arch, sms| SvdEngine::Cusolver { version, arch, sms }.id();
        assert_ne!(gpu.id(), other(12_005, (9, 0), 132));
        assert_ne!(gpu.id(), other(12_004, (10, 0), 132));
        assert_ne!(gpu.id(), other(12_004, (9, 0), 114));
    }
}

//! `--device auto|cpu|cuda`, one flag for every command that takes it (merge, bake,
//! restack, extract): parsed here (`DeviceChoice`'s `ValueEnum`), resolved by
//! `pipeline::Compute::select`; each command prints the reason line. restack runs on the CPU
//! whatever it says; extract runs its SVDs where it says.

use wanbake::gpu::DeviceChoice;
use wanbake::pipeline::{Compute, DeviceReport};

/// The `--device` flag.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct DeviceArg {
    /// Where merged tensors are computed: auto (CUDA when a device and its libraries load,
    /// else the CPU), cpu, or cuda (fail when CUDA is unavailable). The manifest records
    /// which ran.
    // (restack and extract say what it means for them: `cli::Command`.)
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
}

impl DeviceArg {
    /// Resolves the flag; `--device cuda` without a usable GPU is an error saying why.
    pub fn select(self) -> anyhow::Result<(Compute, DeviceReport)> {
        Ok(Compute::select(self.device)?)
    }
}

/// The JSON of a device choice, for `--json` outputs.
pub fn device_json(r: &DeviceReport) -> serde_json::Value {
    serde_json::json!({ "used": r.used, "name": r.name, "reason": r.reason })
}

//! `--device auto|cpu|cuda` of `merge` and `bake`: parsed here, resolved by
//! `merge::Compute::select`; each command prints the reason line. (`restack` takes the same
//! values with its own help text: it checks the flag and always runs on the CPU.)

use wanbake::gpu::DeviceChoice;
use wanbake::merge::{Compute, DeviceReport};

/// The `--device` flag.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct DeviceArg {
    /// Where merged tensors are computed: auto (CUDA when a device and its libraries load,
    /// else the CPU), cpu, or cuda (fail when CUDA is unavailable). The manifest records
    /// which ran.
    #[arg(long, default_value = "auto", value_name = "auto|cpu|cuda")]
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

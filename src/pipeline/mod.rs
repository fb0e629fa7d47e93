//! The pipeline every producing command runs: a plan, the one executor, and the one call
//! that writes a plan as a release.
//!
//! Owns, stage by stage:
//! 1. the plan ([`Plan`], `plan`): bound adapters placed on their base tensors as
//!    [`Target`]s, one [`Job`] per output tensor piece, the output side ([`OutputOptions`],
//!    `output`: files, names, layouts, dtypes, a quantized output's encodings), and when the
//!    base is hashed ([`Ready`]);
//! 2. the executor ([`Exec`], `exec`): the job loop on the rayon workers in output-file
//!    order, copying, converting and encoding untouched tensors, reading base rows
//!    (`base_rows`), with the compute routes and their lanes ([`Compute`], `compute`); a job
//!    that reads a target goes to a [`TargetWriter`] (the merge engine's `merge::Merger`);
//! 3. [`write`] (`write`): a [`Ready`] plan through the release writer (`release`); an
//!    Orbax output's chunks stream through `orbax` and its databases are written last;
//!    [`write_matrix`]: several plans of the same base and adapters in one pass (`matrix`:
//!    each stored tensor read once, each target computed once), committed all or none.
//!
//! Every value written is checked in the pass that writes it: what the output cannot hold
//! (NaN, ±inf, an overflow of its dtype or format) is refused, or written and reported when
//! the output allows it ([`NonFinite`], [`UnheldValues`], `nonfinite`).
//!
//! Does not own: how a merged target is computed (`merge`, plugged in through
//! [`TargetWriter`] and [`TargetValues`]), binding (`adapter`), model facts and layouts
//! (`model`, `layout`), the encodings (`quant::encode`, `codec`), the atomic output and its
//! manifest (`release`). Producers: `merge`, `convert`,
//! `restack`, `extract` (its `--adapter` stack), `bake`.

pub mod base_rows;
pub mod compute;
pub mod error;
pub mod exec;
pub mod job;
pub mod matrix;
pub mod nonfinite;
pub mod orbax;
pub mod output;
pub mod plan;
pub mod write;

pub use compute::{Compute, DeviceRecord, DeviceReport, Lanes};
pub use error::PipelineError;
pub use exec::{CopyOnly, Exec, ExecOptions, ExecOutcome, TargetValues, TargetWriter, Uses};
pub use job::{Contribution, Job, RowOrder, Target};
pub use nonfinite::{NonFinite, Origin, UnheldValues};
pub use output::{BadOption, Container, OutputChoices, OutputFormat, OutputOptions};
pub use plan::{AdapterReport, Plan, Ready, TargetIndex};
pub use write::{MatrixOutput, Writing, write, write_matrix};

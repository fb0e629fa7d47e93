//! A release matrix's one pass: several outputs of the same base and adapters written
//! together, each base tensor read once and each merged target computed once.
//!
//! Owns: [`run_matrix`]: every output's jobs grouped by what they read (a stored base tensor,
//! or one layer of a stacked one); each group runs on one worker, its target (if any)
//! computed once through [`TargetWriter::share`] and handed to every output's job
//! ([`TargetWriter::write_shared`]), its untouched tensor copied or encoded into each output
//! from the same mapped pages while they are resident. Groups run in the file order of the
//! largest output (the lead: its window moves front to back as a single run's would); the
//! other outputs take their bytes in that order, and what lands beyond their window is
//! spilled and read back once for its digests (`release::ordered`). Each output's bytes are
//! its own executor's ([`Exec::run_job`]), so an output of a matrix is byte-identical to the
//! same output written alone.
//!
//! Each output's outcome says the CPU time its own jobs took (copying, rounding, encoding
//! and writing; a shared target's merge is no one output's): a quality table's figure,
//! never a byte of an output.
//!
//! Memory: a worker holds one group's shared target (the merged tensor in f32, for the
//! merge engine) and, per output, what a single run's worker holds.
//!
//! Does not own: the executor of one output (`pipeline::exec`), what a shared target is
//! (`merge`), the staged outputs and their commit (`release`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::PipelineError;
use super::exec::{Exec, ExecOutcome, TargetWriter, Uses};
use crate::release::writer::Slot;

/// One group of jobs reading the same stored data: (output, job index) pairs, the lead's
/// first.
struct Group {
    members: Vec<(usize, usize)>,
}

/// Runs every job of every output, each group of jobs reading the same stored data on one
/// worker with its target computed once; `targets[i]` computes output `i`'s targets (each
/// output's plan has its own, of the same base and adapters). Returns each output's
/// outcome, in order. On error the caller discards every output.
pub fn run_matrix<T: TargetWriter>(
    execs: Vec<Exec<'_>>,
    targets: &[&T],
) -> Result<Vec<ExecOutcome>, T::Error> {
    if execs.is_empty() || execs.len() != targets.len() {
        let e = PipelineError::Internal("a matrix needs one target writer per output".into());
        return Err(e.into());
    }
    let lead = (0..execs.len())
        .max_by_key(|&i| (execs[i].staging().plan().tensor_bytes(), usize::MAX - i))
        .unwrap_or(0);
    let groups = groups(&execs, lead);
    let uses = Uses::new(execs.iter().flat_map(|e| &e.plan.jobs));
    let position = |g: &Group| match g.members.first() {
        Some(&(i, j)) if i == lead => {
            let job = &execs[i].plan.jobs[j];
            (job.slot, job.dst_offset)
        }
        // Not in the lead: after its every byte, in group order.
        _ => (
            Slot {
                file: usize::MAX,
                tensor: 0,
            },
            usize::MAX,
        ),
    };
    let spent: Vec<AtomicU64> = execs.iter().map(|_| AtomicU64::new(0)).collect();
    let run_group = |workers: &mut Vec<T::Worker>, g: &Group| -> Result<(), T::Error> {
        let shared = share(&execs, targets, workers, g)?;
        for &(i, j) in &g.members {
            let job = &execs[i].plan.jobs[j];
            let started = thread_cpu_nanos();
            let src = execs[i].run_job(targets[i], &mut workers[i], job, shared.as_ref())?;
            spent[i].fetch_add(thread_cpu_nanos() - started, Ordering::Relaxed);
            uses.done(job, src.as_ref());
        }
        Ok(())
    };
    let init = || targets.iter().map(|t| t.worker()).collect::<Vec<_>>();
    let staging = execs[lead].staging();
    execs[lead]
        .options()
        .clone()
        .install(|| staging.for_each_in_file_order(&groups, position, init, run_group))?;
    (execs.into_iter().zip(spent))
        .map(|(e, spent)| {
            let mut outcome = e.finish()?;
            outcome.cpu_seconds = spent.into_inner() as f64 * 1e-9;
            Ok(outcome)
        })
        .collect()
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_nanos() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// The target of group `g`, computed once by the writer of the first output whose job reads
/// it; `None` for an untouched tensor or a writer that does not share.
fn share<T: TargetWriter>(
    execs: &[Exec<'_>],
    targets: &[&T],
    workers: &mut [T::Worker],
    g: &Group,
) -> Result<Option<T::Shared>, T::Error> {
    let reads_target = g.members.iter().find_map(|&(i, j)| {
        let job = &execs[i].plan.jobs[j];
        job.target.map(|t| (i, job, &execs[i].plan.targets[t]))
    });
    let Some((i, job, target)) = reads_target else {
        return Ok(None);
    };
    // One output alone gains nothing from a shared copy of its target.
    if g.members.len() < 2 {
        return Ok(None);
    }
    let src = super::exec::stored(execs[i].plan, job)?;
    targets[i].share(&mut workers[i], job, target, &src)
}

/// Every output's jobs grouped by the stored data they read (a constant is a group of its
/// own), each group's members the lead's first, then by output; groups in the order of
/// their first member.
fn groups(execs: &[Exec<'_>], lead: usize) -> Vec<Group> {
    let mut by_source: BTreeMap<(usize, &str, Option<usize>), usize> = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let order = std::iter::once(lead).chain((0..execs.len()).filter(|&i| i != lead));
    for i in order {
        for (j, job) in execs[i].plan.jobs.iter().enumerate() {
            if job.constant.is_some() {
                groups.push(Group {
                    members: vec![(i, j)],
                });
                continue;
            }
            let key = (job.component, job.stored.as_str(), job.layer);
            match by_source.get(&key) {
                Some(&g) => groups[g].members.push((i, j)),
                None => {
                    by_source.insert(key, groups.len());
                    groups.push(Group {
                        members: vec![(i, j)],
                    });
                }
            }
        }
    }
    groups
}

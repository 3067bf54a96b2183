//! `comminsight-agent roles DIR [--job J] [--json]`: communicator roles and the parallel grid,
//! recomputed from the segments with the current rules.

use crate::roles::{render_human, JobRoles};

use super::offline::{report_skipped, with_skipped};
use super::{exit, RolesArgs};

pub fn run(a: &RolesArgs) -> anyhow::Result<u8> {
    super::offline::settings(&a.config, None)?;
    let input = super::offline::open_input(&a.dir, "roles")?;
    let mut jobs = crate::offline::replay::roles(&input);
    let skipped = input.skipped();
    super::keep_job(&mut jobs, a.job.as_deref(), &a.dir, |j| &j.job)?;
    if a.json {
        let v = match jobs.as_slice() {
            [one] => serde_json::to_value(one)?,
            many => serde_json::json!({ "jobs": many }),
        };
        let text = serde_json::to_string_pretty(&with_skipped(v, &skipped))?;
        println!("{text}");
    } else {
        for (i, j) in jobs.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", render_human(j));
        }
        print_summary(&jobs);
    }
    report_skipped(&skipped);
    Ok(exit::OK)
}

fn print_summary(jobs: &[JobRoles]) {
    for j in jobs {
        let unknown = j.comms.iter().filter(|c| c.role.is_none()).count();
        if unknown > 0 {
            println!(
                "{}: {unknown} communicator(s) without a role (no name, no telling traffic)",
                j.job
            );
        }
    }
}

//! `comminsight-agent doctor`: what works on this host and what to fix.

use crate::doctor::{run_checks, DoctorEnv};

use super::{load_config, DoctorArgs};

pub fn run(a: &DoctorArgs) -> anyhow::Result<u8> {
    let cfg = load_config(a.config.as_deref())?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let report = run_checks(&cfg, &DoctorEnv::host(&env));
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(report.exit_code())
}

use super::*;

#[test]
fn plans_for_the_driver_name_comms_and_steps() {
    let s = crate::plan::tests_support::scenario("megatron");
    let l = s.layout();
    let plans = crate::plan::build(&s, &l, 2, &[]).unwrap();
    let cfg = RunConfig {
        scenario: s.clone(),
        layout: l,
        hosts: 2,
        steps: 2,
        seed: 1,
        faults: vec![],
        out: PathBuf::from("/tmp/x"),
        timeout: Duration::from_secs(1),
        lib_dir: PathBuf::from("/nonexistent"),
        no_plugin: false,
        job: "j".into(),
        python: "python3".into(),
        netns: false,
        keep_rings: false,
    };
    let v = driver_plan(&cfg, &plans[5], Path::new("/tmp/x/run"));
    assert_eq!(v["rank"], 5);
    assert_eq!(v["comms"][0]["name"], "tp:pp1_dp0");
    assert_eq!(
        v["comms"].as_array().unwrap().last().unwrap()["role"],
        "global"
    );
    assert_eq!(v["steps"].as_array().unwrap().len(), 2);
    assert_eq!(v["truth_file"], "/tmp/x/run/rank-5.json");
    assert_eq!(rank_hosts(8, 2)[5], "host1");
    let mut bad = cfg.clone();
    bad.faults = vec!["slowlink:a=0,b=1,rate=1mbit".parse().unwrap()];
    assert!(matches!(slowlinks(&bad), Err(RunError::SameHost { .. })));
    bad.faults = vec!["slowlink:a=0,b=7,rate=1mbit".parse().unwrap()];
    assert_eq!(slowlinks(&bad).unwrap()[0].0, 0);
    assert_eq!(slowlinks(&bad).unwrap()[0].1, 1);
}

#[test]
fn the_embedded_drivers_and_fake_torch_are_valid_python() {
    let sources = [
        ("rank_driver.py", RANK_DRIVER),
        ("torch_driver.py", TORCH_DRIVER),
    ];
    for (name, text) in sources.into_iter().chain(FAKE_TORCH.iter().copied()) {
        let out = Command::new("python3")
            .args(["-c", "import ast,sys; ast.parse(sys.stdin.read())"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(text.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every file of python/fake_torch is embedded.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/fake_torch");
    let mut on_disk = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "py") {
                on_disk.push(
                    p.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    on_disk.sort();
    let mut embedded: Vec<String> = FAKE_TORCH.iter().map(|(p, _)| p.to_string()).collect();
    embedded.sort();
    assert_eq!(on_disk, embedded);
}

#[test]
fn torch_plans_carry_every_group_and_the_mesh_in_the_layout_order() {
    let mut s = crate::plan::tests_support::scenario("torch_moe");
    let l = s.layout().with_order("tp-cp-ep-pp-dp".parse().unwrap());
    let plans = crate::plan::build(&s, &l, 1, &[]).unwrap();
    let mut cfg = RunConfig {
        scenario: s.clone(),
        layout: l,
        hosts: 2,
        steps: 1,
        seed: 1,
        faults: vec![],
        out: PathBuf::from("/tmp/x"),
        timeout: Duration::from_secs(1),
        lib_dir: PathBuf::from("/nonexistent"),
        no_plugin: false,
        job: "j".into(),
        python: "python3".into(),
        netns: false,
        keep_rings: false,
    };
    let v = driver_plan(&cfg, &plans[3], Path::new("/tmp/x/run"));
    assert_eq!(v["frontend"], "torch");
    assert_eq!(v["torch_groups"], "megatron");
    assert_eq!(v["all_groups"]["tp"].as_array().unwrap().len(), 8);
    assert_eq!(v["all_groups"]["ep"].as_array().unwrap().len(), 4);
    assert_eq!(v["all_groups"]["dp"][0], serde_json::json!([0, 4, 8, 12]));
    assert!(v["all_groups"].get("global").is_none());
    // slowest first, size-1 dims left out: dp (4), pp (2), tp (2)
    assert_eq!(v["mesh"]["names"], serde_json::json!(["dp", "pp", "tp"]));
    assert_eq!(v["mesh"]["shape"], serde_json::json!([4, 2, 2]));
    s.workload.frontend = Frontend::Nccl;
    cfg.scenario = s;
    let v = driver_plan(&cfg, &plans[3], Path::new("/tmp/x/run"));
    assert!(v.get("frontend").is_none() && v.get("all_groups").is_none());
}

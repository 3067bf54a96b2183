use super::*;

fn reg() -> Registry {
    Registry::default()
}

#[test]
fn announce_derives_and_validates() {
    let mut r = reg();
    let tp = r
        .announce(None, "TENSOR_MODEL_PARALLEL_GROUP", "3", &[4, 5], 5)
        .unwrap();
    assert_eq!(r.get(tp).unwrap().name, "tp:TENSOR_MODEL_PARALLEL_GROUP:3");
    assert_eq!(r.get(tp).unwrap().index, 1);
    let dp = r.announce(Some("DP"), "grads", "7", &[0, 2, 4], 0).unwrap();
    assert_eq!(r.get(dp).unwrap().name, "dp:grads:7");
    let u = r.announce(Some(""), "undefined", "9", &[1], 1).unwrap();
    assert_eq!(r.get(u).unwrap().name, "undefined:9");

    let e = r.announce(Some("xp"), "g", "1", &[0], 0).unwrap_err();
    assert_eq!(e, AnnounceError::UnknownRole("xp".into()));
    assert!(e.to_string().contains("\"xp\"") && !e.to_string().contains('\n'));
    assert!(matches!(
        r.announce(None, "g", "1", &[0, 1], 2),
        Err(AnnounceError::NotMember { my_rank: 2, .. })
    ));
    assert!(matches!(
        r.announce(None, "g", "1", &[0, 1, 0], 0),
        Err(AnnounceError::BadRank { rank: 0, .. })
    ));
    assert_eq!(
        r.announce(None, "g", "1", &[], 0),
        Err(AnnounceError::BadSize(0))
    );
    assert_eq!(r.anns.len(), 3, "rejected announcements change nothing");
}

#[test]
fn names_fit_the_record_field() {
    let desc = "D".repeat(200);
    let n = group_comm_name(Some(Role::Pp), &desc, "12");
    assert_eq!(n.len(), MAX_NAME_BYTES);
    assert!(n.starts_with("pp:DDD") && n.ends_with(":12"), "{n}");
    let n = group_comm_name(None, &desc, "12");
    assert_eq!(n.len(), MAX_NAME_BYTES);
    assert!(n.ends_with(":12"));
    let long_name = "n".repeat(100);
    assert_eq!(
        group_comm_name(Some(Role::Tp), "x", &long_name).len(),
        MAX_NAME_BYTES
    );
    let multibyte = "é".repeat(60);
    let n = group_comm_name(Some(Role::Dp), &multibyte, "1");
    assert!(n.len() <= MAX_NAME_BYTES && n.ends_with(":1"), "{n}");
}

#[test]
fn matching_rules() {
    let mut r = reg();
    let tp = r.announce(Some("tp"), "t", "1", &[0, 1], 0).unwrap();
    let pp = r.announce(Some("pp"), "p", "2", &[0, 8], 0).unwrap();
    let dp = r.announce(Some("dp"), "d", "3", &[0, 2, 4, 6], 0).unwrap();
    // Current group wins when it fits.
    let c = r.choose(pp, Some((2, 0))).unwrap();
    assert_eq!(c.ann, Some(pp as usize));
    // Does not fit (nranks > size): falls through to the size rule.
    let c = r.choose(tp, Some((4, 0))).unwrap();
    assert_eq!(c.ann, Some(dp as usize));
    // Ambiguous size 2 (tp and pp): nothing.
    assert_eq!(r.choose(-1, Some((2, 0))), None);
    // Once tp is used, pp is the only unused size-2 group.
    r.count_named(Some(tp as usize));
    assert_eq!(r.choose(-1, Some((2, 0))).unwrap().ann, Some(pp as usize));
    // Index must equal rank.
    assert_eq!(r.choose(-1, Some((4, 1))), None);
    // Split (no geometry): only the current group.
    assert_eq!(r.choose(dp, None).unwrap().name, "dp:d:3");
    assert_eq!(r.choose(-1, None), None);
    // The environment role last.
    r.env_role = Some(Role::Dp);
    let c = r.choose(-1, Some((3, 0))).unwrap();
    assert_eq!((c.ann, c.name.as_str()), (None, "dp"));
    assert_eq!(r.group_comms(tp), 1);
    assert_eq!(r.group_comms(99), -1);
    assert_eq!(r.group_comms(-1), -1);
}

#[test]
fn interning_is_stable_and_bounded() {
    let mut r = reg();
    let a = r.intern("tp:x").unwrap();
    assert_eq!(r.intern("tp:x"), Some(a));
    assert_ne!(r.intern("tp:y"), Some(a));
    assert_eq!(r.intern("bad\0name"), None);
    for i in 0..MAX_NAMES {
        let _ = r.intern(&format!("n{i}"));
    }
    assert_eq!(r.intern("one-too-many"), None);
    assert!(r.names_dropped >= 1);
    assert_eq!(r.intern("tp:x"), Some(a), "known names still resolve");
}

#[test]
fn remembered_configs_are_bounded_and_forgotten() {
    let mut r = reg();
    r.remember(0x10, ConfigBuf::defaults(23007));
    assert!(r.config_of(0x10).is_some());
    r.forget(0x10);
    assert!(r.config_of(0x10).is_none());
    r.remember(0, ConfigBuf::defaults(23007));
    assert!(r.config_of(0).is_none());
}

#[test]
fn warnings_once_each_and_bounded() {
    let mut w = Warnings::default();
    assert!(w.push("a".into()));
    assert!(!w.push("a".into()));
    for i in 0..MAX_WARNINGS + 4 {
        w.push(format!("m{i}"));
    }
    assert_eq!(w.queue.len(), MAX_WARNINGS);
    assert!(w.dropped >= 4);
    assert_eq!(w.pop().as_deref(), Some("a"));
    assert!(
        !w.push("a".into()),
        "a popped message is still not repeated"
    );
}

#[test]
fn current_group_is_per_thread_and_checked() {
    let id = with_registry(|r| r.announce(Some("ep"), "e", "1", &[3], 3).unwrap());
    set_current_group(id);
    assert_eq!(current_group(), id);
    std::thread::spawn(|| assert_eq!(current_group(), -1))
        .join()
        .unwrap();
    set_current_group(1 << 20);
    assert_eq!(current_group(), -1, "unknown ids clear");
}

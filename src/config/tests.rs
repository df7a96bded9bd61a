use super::*;

const MINIMAL: &str = r#"
[[upstreams]]
id = "u"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
rpm = 10

[[routes]]
models = ["*"]
upstreams = ["u"]

[[tenants]]
id = "t"
api_key_hashes = ["sha256:f77894fdfa58e447c57e077eaa9708e8e009c84dc6aba2db80461275e9b85be7"]
tpm = 100
"#;

fn invalid(text: &str) -> (String, String) {
    match Config::from_toml(text, "test.toml") {
        Err(ConfigError::Invalid {
            file,
            field,
            reason,
        }) => {
            assert_eq!(file, "test.toml");
            (field, reason)
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn demo_config_is_valid_and_small() {
    let demo = Config::demo().expect("embedded demo config must validate");
    let tenant = &demo.tenants[0];
    assert_eq!(tenant.id, "demo");
    assert!(tenant.quota.rpm.is_some_and(|rpm| rpm <= 60));
    assert_eq!(
        normalize_key_hash(&tenant.api_key_hashes[0]),
        hash_api_key("sk-demo")
    );
    assert_eq!(demo.server.admin_token.as_deref(), Some("admin-demo"));
}

#[test]
fn minimal_config_gets_defaults() {
    let config = Config::from_toml(MINIMAL, "test.toml").unwrap();
    assert_eq!(config.limits.window, defaults::WINDOW);
    assert_eq!(config.limits.batch_share, defaults::BATCH_SHARE);
    assert_eq!(config.tenants[0].quota.tpm, Some(100));
    assert_eq!(config.tenants[0].quota.rpm, None);
}

#[test]
fn unknown_field_is_refused_with_file_and_field() {
    let text = format!("{MINIMAL}\n[server]\nlisten_addr = \"x\"\n");
    match Config::from_toml(&text, "test.toml") {
        Err(err @ ConfigError::Parse { .. }) => {
            let message = err.to_string();
            assert!(message.starts_with("test.toml: "), "{message}");
            assert!(message.contains("listen_addr"), "{message}");
        }
        other => panic!("expected Parse error, got {other:?}"),
    }
}

#[test]
fn impossible_combinations_name_the_field() {
    let (field, reason) =
        invalid(&MINIMAL.replace(r#"upstreams = ["u"]"#, r#"upstreams = ["nope"]"#));
    assert_eq!(field, "routes[0].upstreams[0]");
    assert!(reason.contains("nope"));

    let (field, _) = invalid(&MINIMAL.replace("tpm = 100", "tpm = 0"));
    assert_eq!(field, "tenants[0].tpm");

    let (field, _) = invalid(&MINIMAL.replace("tpm = 100", "tpm = 100\notpm = 0"));
    assert_eq!(field, "tenants[0].otpm");
    let (field, reason) = invalid(&MINIMAL.replace("tpm = 100", "itpm = 1125899906842625"));
    assert_eq!(field, "tenants[0].itpm");
    assert!(reason.contains("at most"), "{reason}");

    let (field, _) = invalid(&format!("{MINIMAL}\n[limits]\nidle_timeout = \"10s\"\n"));
    assert_eq!(field, "limits.idle_timeout");

    let (field, _) = invalid(&MINIMAL.replace("tpm = 100", "tpm = 100\nrpd = 0"));
    assert_eq!(field, "tenants[0].rpd");
    let (field, reason) = invalid(&format!("{MINIMAL}\n[limits]\nday_window = \"30s\"\n"));
    assert_eq!(field, "limits.day_window");
    assert!(reason.contains("limits.window"), "{reason}");
    let (field, _) = invalid(&format!("{MINIMAL}\n[limits]\nday_buckets = 0\n"));
    assert_eq!(field, "limits.day_buckets");

    let (field, _) = invalid(&format!("{MINIMAL}\n[limits]\nbatch_share = 1.5\n"));
    assert_eq!(field, "limits.batch_share");

    let (field, _) = invalid(&MINIMAL.replace("sha256:f778", "sha256:zz78"));
    assert_eq!(field, "tenants[0].api_key_hashes[0]");

    // The provider key goes out as a header on every request.
    for key in ["", "sk with space", "sk-é", "sk-\\n"] {
        let (field, reason) =
            invalid(&MINIMAL.replace("rpm = 10\n", &format!("rpm = 10\napi_key = \"{key}\"\n")));
        assert_eq!(field, "upstreams[0].api_key", "{key:?}");
        assert!(reason.contains("printable ASCII"), "{reason}");
    }
    let keyed = MINIMAL.replace("rpm = 10\n", "rpm = 10\napi_key = \"sk-proj_AZ09.~+/=\"\n");
    assert!(Config::from_toml(&keyed, "test.toml").is_ok());

    for workers in [0, defaults::MAX_WORKER_THREADS + 1] {
        let (field, reason) = invalid(&format!("[server]\nworker_threads = {workers}\n{MINIMAL}"));
        assert_eq!(field, "server.worker_threads");
        assert!(reason.contains("between 1 and 1024"), "{reason}");
    }
    let one = format!("[server]\nworker_threads = 1\n{MINIMAL}");
    assert_eq!(
        Config::from_toml(&one, "test.toml")
            .unwrap()
            .server
            .worker_threads,
        Some(1)
    );
}

#[test]
fn settings_that_would_silently_do_nothing_are_refused() {
    // The adaptive p95 is read from the last 128 completions: a minimum above
    // that would never be reached.
    let (field, reason) = invalid(&format!(
        "{MINIMAL}\n[estimation]\nadaptive_min_samples = 129\n"
    ));
    assert_eq!(field, "estimation.adaptive_min_samples");
    assert!(reason.contains("1..=128"), "{reason}");
    let ok = format!("{MINIMAL}\n[estimation]\nadaptive_min_samples = 128\n");
    assert!(Config::from_toml(&ok, "test.toml").is_ok());

    // The default max_wait (30 s) is held to the request timeout too.
    let short = format!("{MINIMAL}\n[server]\nrequest_timeout = \"10s\"\n");
    let (field, reason) = invalid(&short);
    assert_eq!(field, "tenants[0].max_wait");
    assert!(reason.contains("unset"), "{reason}");
    let set = short.replace("tpm = 100", "tpm = 100\nmax_wait = \"5s\"");
    assert!(Config::from_toml(&set, "test.toml").is_ok());

    // The built-in mock's limits are exact: a scope's algorithm does not apply.
    let mock = format!("{MINIMAL}\n[builtin_mock]\nlisten = \"127.0.0.1:0\"\nrpm = 5\n");
    let config = Config::from_toml(&mock, "test.toml").unwrap();
    assert_eq!(config.builtin_mock.unwrap().quota().rpm, Some(5));
    let with_algorithm = format!("{mock}algorithm = \"token-bucket\"\n");
    let message = Config::from_toml(&with_algorithm, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(message.contains("algorithm"), "{message}");
    // Its model groups count per minute only: a daily figure there is refused.
    let group = format!("{mock}\n[[builtin_mock.model_limits]]\nmodels = [\"gpt-4o\"]\nrpd = 3\n");
    let (field, reason) = invalid(&group);
    assert_eq!(field, "builtin_mock.model_limits[0].rpd");
    assert!(reason.contains("rpm, tpm, itpm and otpm only"), "{reason}");
}

#[test]
fn bad_duration_is_explained() {
    let text = format!("{MINIMAL}\n[limits]\nwindow = \"60\"\n");
    let message = Config::from_toml(&text, "test.toml")
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("window") && message.contains("unit"),
        "{message}"
    );
}

#[test]
fn secrets_expand_from_env_and_missing_ones_are_refused() {
    let text = MINIMAL.replace("rpm = 10", "rpm = 10\napi_key = \"k-${PROVIDER_KEY}\"");
    let unset = |_: &str| None;
    match Config::from_toml_with_env(&text, "test.toml", &unset) {
        Err(ConfigError::Invalid { field, reason, .. }) => {
            assert_eq!(field, "upstreams[0].api_key");
            assert!(reason.contains("PROVIDER_KEY"), "{reason}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let set = |name: &str| (name == "PROVIDER_KEY").then(|| "secret".to_owned());
    let config = Config::from_toml_with_env(&text, "test.toml", &set).unwrap();
    assert_eq!(config.upstreams[0].api_key.as_deref(), Some("k-secret"));
}

/// Every `.toml` under `dir` and its subdirectories, parsed and validated.
fn repo_configs(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Config)> {
    let any_env = |name: &str| Some(format!("value-of-{name}"));
    let mut out = Vec::new();
    let mut entries: Vec<_> = (std::fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(repo_configs(&path));
        } else if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let file = path.display().to_string();
            let config = Config::from_toml_with_env(&text, &file, &any_env)
                .unwrap_or_else(|e| panic!("{e}"));
            out.push((path, config));
        }
    }
    out
}

#[test]
fn example_configs_in_the_repo_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let checked = repo_configs(&dir).len();
    assert!(
        checked >= 5,
        "expected the demo, the examples and the compose nodes"
    );
}

/// `docker-compose.yml` cannot run on the test machines (no container engine),
/// so what ties it to its node configs is checked here: each node's config is
/// mounted by its own service, which has the IP the config announces; every
/// node seeds from the others' announced gossip addresses; one cluster, one id
/// each.
#[test]
fn the_compose_cluster_agrees_with_its_node_configs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let compose = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    let nodes = repo_configs(&root.join("config/compose"));
    assert_eq!(nodes.len(), 3);
    let clusters: Vec<_> = (nodes.iter())
        .map(|(_, c)| c.cluster.clone().expect("a cluster node"))
        .collect();
    let gossip: Vec<_> = (clusters.iter())
        .map(|c| c.gossip_advertise.expect("announces its address"))
        .collect();
    for (i, ((path, _), cluster)) in nodes.iter().zip(&clusters).enumerate() {
        let ip = gossip[i].ip();
        assert_eq!(cluster.cluster_id, clusters[0].cluster_id);
        assert_eq!(cluster.rpc_advertise.map(|a| a.ip()), Some(ip));
        let mut seeds = cluster.seeds.clone();
        seeds.sort();
        let mut others: Vec<String> = (gossip.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .map(|(_, a)| a.to_string())
            .collect();
        others.sort();
        assert_eq!(seeds, others, "{}", path.display());
        // The service that mounts this file, up to the next service.
        let mount = format!(
            "./config/compose/{}",
            path.file_name().unwrap().to_string_lossy()
        );
        let at = compose
            .find(&mount)
            .unwrap_or_else(|| panic!("{mount} is not mounted"));
        let service_start = compose[..at].rfind("\n  node").unwrap();
        let service_end = (compose[at..].find("\n\n")).map_or(compose.len(), |e| at + e);
        let service = &compose[service_start..service_end];
        assert!(
            service.contains(&format!("ipv4_address: {ip}")),
            "{mount}'s service lacks its IP {ip}: {service}"
        );
    }
    let mut ids: Vec<_> = clusters.iter().map(|c| c.node_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3);
}

#[test]
fn cluster_settings_that_break_the_promises_are_refused() {
    let cluster = |extra: &str| {
        format!(
            "{MINIMAL}\n[cluster]\ncluster_id = \"c\"\nnode_id = \"n1\"\ngossip_listen = \"127.0.0.1:7001\"\nrpc_listen = \"127.0.0.1:7101\"\nsecret = \"0123456789abcdef\"\n{extra}"
        )
    };
    let lease = |extra: &str| format!("{}\n[cluster.lease]\n{extra}", cluster(""));
    let config = Config::from_toml(&cluster(""), "test.toml").unwrap();
    assert_eq!(
        config.cluster.map(|c| c.mode),
        Some(super::SyncMode::Lease),
        "lease is the cluster default"
    );
    // 1 s gossip with phi 8 detects a death within 18 s: a 15 s grace is too short.
    let (field, _) = invalid(&cluster(
        "gossip_interval = \"1s\"\ndead_node_grace = \"15s\"",
    ));
    assert_eq!(field, "cluster.dead_node_grace");
    let (field, _) = invalid(&cluster("sync_interval = \"5s\""));
    assert_eq!(field, "cluster.sync_interval");
    let (field, _) = invalid(&cluster("").replace("7001", "0"));
    assert_eq!(field, "cluster.gossip_listen");
    let (field, _) = invalid(&format!(
        "{}\n[limits]\nalgorithm = \"token-bucket\"\n",
        cluster("")
    ));
    assert_eq!(field, "limits.algorithm");
    // Buckets of a whole number of milliseconds, the day's too.
    let (field, _) = invalid(&format!(
        "{}\n[limits]\nwindow = \"1s\"\nbuckets = 3\n",
        cluster("")
    ));
    assert_eq!(field, "limits.buckets");
    let (field, _) = invalid(&format!(
        "{}\n[limits]\nday_window = \"1h\"\nday_buckets = 7\n",
        cluster("")
    ));
    assert_eq!(field, "limits.day_buckets");
    // Lease mode: an RPC address, a real secret, a ttl no shorter than detection.
    let (field, _) = invalid(&cluster("").replace("rpc_listen = \"127.0.0.1:7101\"\n", ""));
    assert_eq!(field, "cluster.rpc_listen");
    let (field, _) = invalid(&cluster("").replace("0123456789abcdef", "short"));
    assert_eq!(field, "cluster.secret");
    // 100 ms gossip with phi 8 detects within 1.8 s: a 1 s lease would end first.
    let (field, reason) = invalid(&lease("ttl = \"1s\""));
    assert_eq!(field, "cluster.lease.ttl");
    assert!(reason.contains("failure-detection"), "{reason}");
    let (field, _) = invalid(&lease("rpc_timeout = \"2s\""));
    assert_eq!(field, "cluster.lease.rpc_timeout");
    let (field, _) = invalid(&lease("max_borrow = 1.5"));
    assert_eq!(field, "cluster.lease.max_borrow");
    let (field, _) = invalid(&lease("max_credit = 0.0"));
    assert_eq!(field, "cluster.lease.max_credit");
    // Spillover: `lease` mode only (it needs the internal RPC), a bounded wait.
    assert!(Config::from_toml(&lease("spillover = true"), "test.toml").is_ok());
    let (field, _) = invalid(&lease("spillover = true\nspillover_wait = \"11s\""));
    assert_eq!(field, "cluster.lease.spillover_wait");
    let (field, reason) = invalid(&format!(
        "{}\n[cluster.lease]\nspillover = true\n",
        cluster("mode = \"gossip\"")
    ));
    assert_eq!(field, "cluster.lease.spillover");
    assert!(reason.contains("`lease` mode"), "{reason}");
    match Config::from_toml(&lease("cut_off = \"sometimes\""), "test.toml") {
        Err(ConfigError::Parse { message, .. }) => {
            assert!(
                message.contains("share`, `fail-closed`, `fail-open"),
                "{message}"
            )
        }
        other => panic!("expected a parse error naming the policies, got {other:?}"),
    }
    // Gossip and local modes need no RPC address, but every mode a secret:
    // it seals the gossip.
    let gossip = cluster("mode = \"gossip\"").replace("rpc_listen = \"127.0.0.1:7101\"\n", "");
    assert!(Config::from_toml(&gossip, "test.toml").is_ok());
    for mode in ["gossip", "local", "redis"] {
        let open =
            cluster(&format!("mode = \"{mode}\"")).replace("secret = \"0123456789abcdef\"\n", "");
        assert_eq!(invalid(&open).0, "cluster.secret", "{mode}");
    }
    // Rotation: up to three more secrets accepted, each as long.
    let accepting = |list: &str| cluster(&format!("accept_secrets = [{list}]"));
    let next = "\"fedcba9876543210\"";
    assert!(Config::from_toml(&accepting(next), "test.toml").is_ok());
    let (field, _) = invalid(&accepting("\"short\""));
    assert_eq!(field, "cluster.accept_secrets");
    let (field, _) = invalid(&accepting(&[next; 4].join(", ")));
    assert_eq!(field, "cluster.accept_secrets");
}

/// A wildcard listen address binds every interface, but announced to peers it
/// reaches each peer's own host: unnoticed on one machine, a silent split
/// across machines (a container's `0.0.0.0`). It needs an advertised address.
#[test]
fn wildcard_listen_addresses_need_an_address_peers_can_dial() {
    let cluster = |gossip: &str, rpc: &str, extra: &str| {
        format!(
            "{MINIMAL}\n[cluster]\ncluster_id = \"c\"\nnode_id = \"n1\"\ngossip_listen = \"{gossip}\"\nrpc_listen = \"{rpc}\"\nsecret = \"0123456789abcdef\"\n{extra}"
        )
    };
    let (field, reason) = invalid(&cluster("0.0.0.0:7001", "127.0.0.1:7101", ""));
    assert_eq!(field, "cluster.gossip_advertise");
    assert!(reason.contains("0.0.0.0:7001"), "{reason}");
    let (field, reason) = invalid(&cluster("127.0.0.1:7001", "[::]:7101", ""));
    assert_eq!(field, "cluster.rpc_advertise");
    assert!(reason.contains("cluster.rpc_listen"), "{reason}");
    // Advertised addresses must themselves be dialable.
    let (field, _) = invalid(&cluster(
        "127.0.0.1:7001",
        "127.0.0.1:7101",
        "rpc_advertise = \"0.0.0.0:7101\"",
    ));
    assert_eq!(field, "cluster.rpc_advertise");
    let (field, _) = invalid(&cluster(
        "127.0.0.1:7001",
        "127.0.0.1:7101",
        "gossip_advertise = \"10.0.0.5:0\"",
    ));
    assert_eq!(field, "cluster.gossip_advertise");
    // Wildcards with the node's own addresses announced: the container shape.
    let config = Config::from_toml(
        &cluster(
            "0.0.0.0:7001",
            "0.0.0.0:7101",
            "gossip_advertise = \"10.0.0.5:7001\"\nrpc_advertise = \"10.0.0.5:7101\"",
        ),
        "test.toml",
    )
    .unwrap();
    assert_eq!(
        config.cluster.unwrap().rpc_advertise,
        Some("10.0.0.5:7101".parse().unwrap())
    );
    // A pod announces its own IP from the environment.
    let pod = cluster(
        "0.0.0.0:7001",
        "0.0.0.0:7101",
        "gossip_advertise = \"${POD_IP}:7001\"\nrpc_advertise = \"${POD_IP}:7101\"",
    );
    let env = |name: &str| (name == "POD_IP").then(|| "10.1.2.3".to_owned());
    let config = Config::from_toml_with_env(&pod, "pod.toml", &env).unwrap();
    let pod_cluster = config.cluster.unwrap();
    assert_eq!(
        pod_cluster.gossip_advertise,
        Some("10.1.2.3:7001".parse().unwrap())
    );
    assert_eq!(
        pod_cluster.rpc_advertise,
        Some("10.1.2.3:7101".parse().unwrap())
    );
    match Config::from_toml_with_env(&pod, "pod.toml", &|_: &str| None) {
        Err(ConfigError::Invalid { field, reason, .. }) => {
            assert_eq!(field, "cluster.gossip_advertise");
            assert!(reason.contains("POD_IP"), "{reason}");
        }
        other => panic!("expected the unset variable named, got {other:?}"),
    }
    let (field, reason) = invalid(&cluster(
        "127.0.0.1:7001",
        "127.0.0.1:7101",
        "rpc_advertise = \"gateway-1:7101\"",
    ));
    assert_eq!(field, "cluster.rpc_advertise");
    assert!(reason.contains("not an IP address"), "{reason}");
    // Gossip mode never announces an RPC address peers use: no rule there.
    let gossip = format!(
        "{MINIMAL}\n[cluster]\ncluster_id = \"c\"\nnode_id = \"n1\"\ngossip_listen = \"10.0.0.5:7001\"\nsecret = \"0123456789abcdef\"\nmode = \"gossip\"\n"
    );
    assert!(Config::from_toml(&gossip, "test.toml").is_ok());
}

/// Each limit has its own burst: one `burst` for both would have to be at most
/// the smaller of rpm and tpm, so a token-bucket tenant's token burst would be
/// its rpm, and every request costing more tokens than that would be refused for
/// good (413).
#[test]
fn each_limit_has_its_own_burst_for_token_bucket_only() {
    let tenant = |extra: &str| {
        MINIMAL.replace(
            "tpm = 100\n",
            &format!("rpm = 60\ntpm = 100000\nalgorithm = \"token-bucket\"\n{extra}"),
        )
    };
    let config = Config::from_toml(&tenant("burst = 60\nburst_tokens = 20000\n"), "test.toml")
        .expect("a burst per limit");
    assert_eq!(config.tenants[0].quota.burst_tokens, Some(20_000));
    let (field, reason) = invalid(&tenant("burst_tokens = 200000\n"));
    assert_eq!(field, "tenants[0].burst_tokens");
    assert!(reason.contains("tpm"), "{reason}");
    let (field, _) = invalid(&tenant("burst = 61\n"));
    assert_eq!(field, "tenants[0].burst");
    // Ignored by the sliding window: refused rather than silently unused.
    let sliding = MINIMAL.replace("tpm = 100\n", "tpm = 100\nburst_tokens = 50\n");
    let (field, reason) = invalid(&sliding);
    assert_eq!(field, "tenants[0].burst_tokens");
    assert!(reason.contains("token-bucket"), "{reason}");
}

/// Values that `serve` would refuse later, unnamed, are refused here.
#[test]
fn values_serve_cannot_use_are_refused_with_their_field() {
    let (field, _) = invalid(&format!("{MINIMAL}\n[limits]\nbuckets = 5000\n"));
    assert_eq!(field, "limits.buckets");
    let (field, _) = invalid(&MINIMAL.replace("tpm = 100\n", "tpm = 2000000000000000\n"));
    assert_eq!(field, "tenants[0].tpm");
    let (field, _) = invalid(&format!(
        "{MINIMAL}\n[estimation]\ndefault_max_tokens = 4611686018427387904\n"
    ));
    assert_eq!(field, "estimation.default_max_tokens");
    for slots in [1000, 512, 1 << 23] {
        let (field, reason) = invalid(&format!(
            "{MINIMAL}\n[estimation]\ncount_memo_slots = {slots}\n"
        ));
        assert_eq!(field, "estimation.count_memo_slots", "{slots}");
        assert!(reason.contains("power of two"), "{reason}");
    }
    let zero_idle = MINIMAL.replace("rpm = 10\n", "rpm = 10\nstream_idle_timeout = \"0s\"\n");
    let (field, _) = invalid(&zero_idle);
    assert_eq!(field, "upstreams[0].stream_idle_timeout");
    // A [redis] table no mode reads would be silently ignored.
    let (field, _) = invalid(&format!(
        "{MINIMAL}\n[redis]\nurl = \"redis://127.0.0.1\"\n"
    ));
    assert_eq!(field, "redis");
}

#[test]
fn model_groups_are_checked_and_named_by_their_first_pattern() {
    let group = |lines: &str| format!("{MINIMAL}\n[[tenants.model_limits]]\n{lines}\n");
    let ok = Config::from_toml(&group("models = [\"gpt-4o*\"]\nrpm = 5"), "t.toml").unwrap();
    let groups = &ok.tenants[0].model_limits;
    assert_eq!(groups[0].group_name(), "gpt-4o*");
    let (field, _) = invalid(&group("models = [\"gpt*4o\"]\nrpm = 5"));
    assert_eq!(field, "tenants[0].model_limits[0].models");
    let (field, _) = invalid(&group("models = []\nrpm = 5"));
    assert_eq!(field, "tenants[0].model_limits[0].models");
    let (field, _) = invalid(&group("models = [\"a\"]\nname = \"a/b\"\nrpm = 5"));
    assert_eq!(field, "tenants[0].model_limits[0].name");
    let (field, _) = invalid(&group("models = [\"a\"]\nname = \"\"\nrpm = 5"));
    assert_eq!(field, "tenants[0].model_limits[0].name");
    let long = format!("models = [\"a\"]\nname = \"{}\"\nrpm = 5", "g".repeat(64));
    let long_id = group(&long).replace("id = \"t\"", &format!("id = \"{}\"", "t".repeat(64)));
    let (field, reason) = invalid(&long_id);
    assert_eq!(field, "tenants[0].model_limits[0].name");
    assert!(reason.contains("gossip"), "{reason}");
    let (field, _) = invalid(&group("models = [\"a\"]\nrpm = 0"));
    assert_eq!(field, "tenants[0].model_limits[0].rpm");
    let twice = format!(
        "{}[[tenants.model_limits]]\nmodels = [\"a\"]\nrpm = 1\n",
        group("models = [\"a\", \"b\"]\nrpm = 5")
    );
    let (field, reason) = invalid(&twice);
    assert_eq!(field, "tenants[0].model_limits[1].name");
    assert!(reason.contains("\"a\""), "{reason}");
    let unknown = Config::from_toml(&group("models = [\"a\"]\nrpm = 5\nbogus = 1"), "t.toml");
    assert!(
        matches!(&unknown, Err(ConfigError::Parse { message, .. }) if message.contains("bogus")),
        "{unknown:?}"
    );
}

#[test]
fn connection_bounds_tls_files_and_the_admin_listener_are_checked() {
    let server = |lines: &str| format!("[server]\n{lines}\n{MINIMAL}");
    for (lines, field) in [
        ("header_timeout = \"10ms\"", "server.header_timeout"),
        ("body_idle_timeout = \"2h\"", "server.body_idle_timeout"),
        ("max_connections = 0", "server.max_connections"),
        (
            "max_connections_per_ip = 0",
            "server.max_connections_per_ip",
        ),
        (
            "listen = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:8080\"",
            "server.admin_listen",
        ),
        (
            "[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"",
            "server.tls.cert",
        ),
    ] {
        let (got, reason) = invalid(&server(lines));
        assert_eq!(got, field, "{lines}: {reason}");
    }
    let fine = server(
        "header_timeout = \"5s\"\nmax_connections_per_ip = 64\nadmin_listen = \"127.0.0.1:9091\"",
    );
    Config::from_toml(&fine, "test.toml").unwrap();
}

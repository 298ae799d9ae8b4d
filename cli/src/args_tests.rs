//! Tests of `args.rs`.

use super::*;
use clap::CommandFactory;

#[test]
fn clap_definition_is_consistent() {
    Args::command().debug_assert();
}

#[test]
fn limits_take_their_options() {
    let args = Args::try_parse_from([
        "disbatch",
        "limits",
        "q",
        "--rate",
        "50/10s",
        "--partition",
        "params.c",
        "--unique-key",
        "params.id",
        "--unique-states",
        "queued,running",
    ])
    .unwrap();
    match args.command {
        Command::Limits { queue, options } => {
            assert_eq!(queue, "q");
            assert_eq!(options.partition.as_deref(), Some("params.c"));
            assert_eq!(
                options.unique_states,
                Some(vec!["queued".to_string(), "running".to_string()])
            );
        }
        other => panic!("parsed as {other:?}"),
    }
    assert!(Args::try_parse_from(["disbatch", "limits", "q", "--partition", "p"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "limits", "q", "--ordered"]).is_err());
}

#[test]
fn maxthreads_values() {
    assert_eq!(parse_maxthreads("null"), Ok(MaxThreads(None)));
    assert_eq!(parse_maxthreads("4"), Ok(MaxThreads(Some(4))));
    assert!(parse_maxthreads("-1").is_err());
    assert!(parse_maxthreads("x").is_err());
}

#[test]
fn skip_takes_a_value_and_status_accepts_negatives() {
    let args = Args::try_parse_from(["disbatch", "tasks", "--skip", "5"]).unwrap();
    assert!(matches!(args.command, Command::Tasks { skip: Some(5), .. }));
    let args =
        Args::try_parse_from(["disbatch", "retry", "--queue", "q", "--status", "-6", "2"]).unwrap();
    match args.command {
        Command::Retry { status, queue, .. } => {
            assert_eq!(status, vec![-6, 2]);
            assert_eq!(queue.as_deref(), Some("q"));
        }
        other => panic!("parsed as {other:?}"),
    }
    assert!(Args::try_parse_from(["disbatch", "retry"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "retry", "id", "--queue", "q"]).is_err());
}

#[test]
fn create_tasks_forms() {
    let args = Args::try_parse_from(["disbatch", "create-tasks", "q", "[{}]", "--json"]).unwrap();
    assert!(args.json);
    assert!(matches!(
        args.command,
        Command::CreateTasks {
            data: Some(_),
            file: None,
            ..
        }
    ));
    let args = Args::try_parse_from(["disbatch", "create-tasks", "q", "--file", "-"]).unwrap();
    assert!(matches!(
        args.command,
        Command::CreateTasks {
            data: None,
            file: Some(_),
            chunk_size: 5000,
            ..
        }
    ));
    assert!(Args::try_parse_from(["disbatch", "create-tasks", "q"]).is_err());
    let args = Args::try_parse_from([
        "disbatch",
        "create-task",
        "q",
        "id=1",
        "--delay-s",
        "90",
        "--priority",
        "-2",
    ])
    .unwrap();
    let Command::CreateTask { pairs, timing, .. } = args.command else {
        panic!("create-task");
    };
    assert_eq!(pairs, ["id=1"]);
    assert_eq!(
        timing,
        TaskTiming {
            not_before: None,
            delay_s: Some(90.0),
            priority: Some(-2)
        }
    );
    assert!(Args::try_parse_from([
        "disbatch",
        "create-task",
        "q",
        "id=1",
        "--delay-s",
        "1",
        "--not-before",
        "2030-01-01T00:00:00Z"
    ])
    .is_err());
    assert!(Args::try_parse_from(["disbatch", "create-tasks", "q", "[]", "--file", "f"]).is_err());
    assert!(Args::try_parse_from([
        "disbatch",
        "create-tasks",
        "q",
        "--file",
        "f",
        "--chunk-size",
        "0"
    ])
    .is_err());
}

#[test]
fn graph_and_batch_take_an_id_or_a_file() {
    let args = Args::try_parse_from(["disbatch", "graph", "abc", "--wait"]).unwrap();
    match args.command {
        Command::Graph { options } => {
            assert_eq!(options.id.as_deref(), Some("abc"));
            assert!(options.wait && !options.cancel);
            assert_eq!(options.interval, 1.0);
        }
        other => panic!("parsed as {other:?}"),
    }
    let args = Args::try_parse_from(["disbatch", "batch", "--create", "b.json", "--wait"]).unwrap();
    assert!(matches!(
        args.command,
        Command::Batch {
            options: WorkflowArgs {
                id: None,
                create: Some(_),
                wait: true,
                ..
            }
        }
    ));
    assert!(Args::try_parse_from(["disbatch", "graph"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "graph", "x", "--create", "f"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "graph", "--create", "f", "--cancel"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "batch", "x", "--interval", "2"]).is_err());
    assert!(Args::try_parse_from(["disbatch", "graphs", "--limit", "0"]).is_err());
}

#[test]
fn global_options_go_before_or_after_the_command() {
    let args =
        Args::try_parse_from(["disbatch", "queues", "--json", "--url", "http://x:1"]).unwrap();
    assert!(args.json);
    assert_eq!(args.url, "http://x:1");
}

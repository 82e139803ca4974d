//! The `watchbridge` command: `run` (the default) is the bridge; the other subcommands help
//! set it up and try it out.

use clap::{CommandFactory, FromArgMatches, Subcommand};
use std::process::ExitCode;
use watchbridge::bridge::{BridgeError, STOP_GAVE_UP_EXIT_CODE};
use watchbridge::builder::BridgeBuilder;
use watchbridge::config::RunArgs;
use watchbridge::demo::{DemoArgs, DemoError, Endings};
use watchbridge::logging::{self, LogFormat};
use watchbridge::pollers::builtin::PollerArgs;
use watchbridge::pollers::once::{output_line, PollOnce};
use watchbridge::termination::Termination;

#[derive(clap::Parser)]
#[command(
    version,
    about = "For every record of an input topic, watch an external resource and emit each new output with its event time"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as `text` or `json` (one object per line); `WATCHBRIDGE_LOG` filters them
    /// (default `info`, e.g. `debug,librdkafka=warn`).
    #[arg(long, global = true, env = "WATCHBRIDGE_LOG_FORMAT", value_name = "WATCHBRIDGE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run the bridge (the default): watch every input record, produce every new output.
    /// Configured by environment variables, each also a flag.
    Run(Box<RunArgs>),
    /// Run an embedded, in-memory Kafka broker and print its bootstrap address (for trying
    /// watchbridge and kcat locally; it keeps nothing).
    Broker {
        /// Topics to create, as NAME or NAME:PARTITIONS.
        #[arg(long = "topic")]
        topics: Vec<String>,
    },
    /// Produce records to a topic: the VALUEs given, or stdin's lines (like `kcat -P`).
    Produce {
        #[arg(long, env = "WATCHBRIDGE_BROKERS", value_name = "WATCHBRIDGE_BROKERS")]
        brokers: String,
        #[arg(long)]
        topic: String,
        /// The key of every record.
        #[arg(long)]
        key: Option<String>,
        /// Split each line at this delimiter into key and value, e.g. `:` for `user-1:{"id":1}`.
        #[arg(long, short = 'K')]
        key_delimiter: Option<String>,
        values: Vec<String>,
    },
    /// Print a topic's records from the beginning: partition:offset, key, timestamp, headers,
    /// value (like `kcat -C`).
    Consume {
        #[arg(long, env = "WATCHBRIDGE_BROKERS", value_name = "WATCHBRIDGE_BROKERS")]
        brokers: String,
        #[arg(long)]
        topic: String,
        /// Stop at the end of the topic instead of waiting for more.
        #[arg(long, short = 'e')]
        exit: bool,
    },
    /// The state topic, for debugging and support tickets.
    #[command(subcommand)]
    State(StateCommand),
    /// The real bridge end to end, with nothing to set up: an embedded Kafka broker, a local
    /// HTTP API of growing per-user feeds, "new user" records, a live view of what reaches
    /// the output topic, and a summary that checks it.
    Demo(Box<DemoArgs>),
    /// Poll one input once with the configured poller and print each output as a JSON line:
    /// a way to check WATCHBRIDGE_POLLER settings against the real resource.
    PollOnce {
        /// The input record's value, as JSON, e.g. `{"id": 42}`.
        #[arg(long)]
        input: String,
        /// The input record's key (the watch key).
        #[arg(long, default_value = "")]
        key: String,
        #[command(flatten)]
        poller: Box<PollerArgs>,
    },
    /// Print the effective configuration of `run`: every setting, its value (secrets
    /// redacted) and where it came from (`flag`, `env`, `file` for NAME_FILE, `default`);
    /// with `--check`, check it as `run` would, without contacting anything. Takes the same
    /// flags and variables as `run`.
    Config(Box<ConfigArgs>),
    /// Check a termination expression: print its normal form, or point at the error.
    CheckTermination {
        /// e.g. `any(total(5m), stable(1m))`
        expression: String,
    },
}

#[derive(clap::Args)]
struct ConfigArgs {
    /// Check the configuration as `run` does before it starts (no broker or resource is
    /// contacted): print `configuration OK`, or every error, each naming its variable (exit 2).
    #[arg(long = "check")]
    config_check: bool,
    /// `text` (one `NAME=value  (source)` line per setting) or `json`.
    #[arg(long = "format", value_name = "FORMAT", value_enum, default_value_t = ConfigFormat::Text)]
    config_format: ConfigFormat,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum ConfigFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum StateCommand {
    /// Print the state topic's records as JSON lines, one per record (watch records, seen
    /// chunks, output offsets, starts records, tombstones; records that do not decode too),
    /// from the beginning to the end it had when the command started.
    Inspect {
        /// The brokers (bootstrap servers); `KAFKA_*` variables set client properties, as
        /// for the bridge.
        #[arg(long, env = "WATCHBRIDGE_BROKERS", value_name = "WATCHBRIDGE_BROKERS")]
        brokers: String,
        /// The state topic (`WATCHBRIDGE_STATE_TOPIC`; the bridge's default is
        /// `<group id>.state`).
        #[arg(long)]
        topic: String,
        /// Only the records of this watch key (and the starts records that list it).
        #[arg(long)]
        key: Option<String>,
        /// Only this partition.
        #[arg(long)]
        partition: Option<i32>,
        /// Print each seen chunk's hashes, not only their count.
        #[arg(long)]
        hashes: bool,
    },
}

#[global_allocator]
static GLOBAL: watchbridge::Allocator = watchbridge::Allocator;

fn main() -> ExitCode {
    keep_openssl_past_exit();
    let code = command();
    // Clients still being destroyed on threads of their own must be gone before the exit
    // handlers run (`kafka/drop_later.rs`).
    watchbridge::kafka::drop_later::wait(std::time::Duration::from_secs(5));
    code
}

/// OpenSSL, by default, frees its locks and tables in an exit handler; a librdkafka thread
/// still at work then (a client a thread made, still waiting on the brokers: the recovery's
/// lookups, warmed up at start) crashes in them: a start that failed early with TLS and
/// SASL died of SIGSEGV in `rd_kafka_ssl_hmac` instead of exiting 1 (tests/secured.rs,
/// one run in three). Asked first, before anything uses OpenSSL, it registers no such
/// handler; the process's memory goes with it anyway.
fn keep_openssl_past_exit() {
    #[link(name = "crypto")]
    extern "C" {
        fn OPENSSL_init_crypto(opts: u64, settings: *const std::ffi::c_void) -> std::ffi::c_int;
    }
    /// `OPENSSL_INIT_NO_ATEXIT` (OpenSSL 1.1.1 and later, `crypto.h`).
    const OPENSSL_INIT_NO_ATEXIT: u64 = 0x0008_0000;
    // SAFETY: a plain initialisation call with no settings, made once on the main thread
    // before any other OpenSSL use; it only sets up OpenSSL's own state.
    unsafe {
        OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, std::ptr::null());
    }
}

/// The command line's command, run.
fn command() -> ExitCode {
    // `WATCHBRIDGE_ADMIN_TOKEN_FILE` and the like, before the settings are read (once, at
    // start, while this is the only thread).
    match watchbridge::config::secrets_from_files(std::env::vars()) {
        Ok(secrets) => {
            for (name, value) in secrets {
                std::env::set_var(name, value);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    // `run --help` groups its settings under headings (config/help.rs).
    let mut command = watchbridge::config::help::with_headings(Cli::command());
    let matches = command
        .try_get_matches_from_mut(with_default_subcommand(std::env::args_os()))
        .unwrap_or_else(|e| e.exit());
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let endings = Endings::default();
    logging::init(
        cli.log_format,
        matches!(cli.command, Command::Demo(_))
            .then(|| Box::new(endings.layer()) as watchbridge::logging::Listener),
    );
    match cli.command {
        Command::Run(args) => {
            let config = match check_run(&args) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match args.poller.build(BridgeBuilder::from_config(config)) {
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
                Ok(Err(e @ BridgeError::StopGaveUp)) => {
                    eprintln!("error: {e}");
                    ExitCode::from(STOP_GAVE_UP_EXIT_CODE)
                }
                Ok(Err(e)) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
                Ok(Ok(())) => ExitCode::SUCCESS,
            }
        }
        Command::Broker { topics } => broker(&topics),
        Command::Produce {
            brokers,
            topic,
            key,
            key_delimiter,
            values,
        } => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let sent = runtime.block_on(watchbridge::kafka::tools::produce(
                &brokers,
                &topic,
                key.as_deref(),
                key_delimiter.as_deref(),
                &values,
            ));
            match sent {
                Ok(n) => {
                    eprintln!("{n} records produced to {topic}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Consume {
            brokers,
            topic,
            exit,
        } => {
            match watchbridge::kafka::tools::consume(&brokers, &topic, exit, &mut std::io::stdout())
            {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::State(StateCommand::Inspect {
            brokers,
            topic,
            key,
            partition,
            hashes,
        }) => state_inspect(&brokers, &topic, key, partition, hashes),
        Command::PollOnce { input, key, poller } => {
            let value = match serde_json::from_str(&input) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("error: --input is not JSON: {e}");
                    return ExitCode::from(2);
                }
            };
            let once = PollOnce {
                value,
                key: key.into_bytes(),
            };
            match poller.build(once) {
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
                Ok(Err(e)) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
                Ok(Ok(result)) => {
                    for output in &result.outputs {
                        println!("{}", output_line(output));
                    }
                    eprintln!(
                        "{} outputs, watermark {}, complete {}",
                        result.outputs.len(),
                        result
                            .watermark
                            .map(watchbridge::pollers::event_time::format_rfc3339)
                            .unwrap_or_else(|| "none".into()),
                        result.complete
                    );
                    ExitCode::SUCCESS
                }
            }
        }
        Command::Config(args) => {
            let (Some(config_command), Some(config_matches)) = (
                command.find_subcommand("config"),
                matches.subcommand_matches("config"),
            ) else {
                unreachable!("the `config` subcommand was parsed")
            };
            config(&args, config_command, config_matches)
        }
        Command::CheckTermination { expression } => match expression.parse::<Termination>() {
            Ok(t) => {
                println!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Demo(args) => match watchbridge::demo::run(&args, endings) {
            Ok(true) => ExitCode::SUCCESS,
            // A check on what reached Kafka failed; the summary says which.
            Ok(false) => ExitCode::FAILURE,
            Err(e @ DemoError::Config(_)) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Everything `run` checks before it starts ([`watchbridge::config::check`]): the settings,
/// or exit code 2 once every error is printed.
fn check_run(args: &RunArgs) -> Result<watchbridge::config::RunConfig, ExitCode> {
    watchbridge::config::check::check_run(args, std::env::vars()).map_err(|errors| {
        for e in &errors {
            eprintln!("error: {e}");
        }
        ExitCode::from(2)
    })
}

/// `watchbridge config [--check] [--format json]`.
fn config(args: &ConfigArgs, command: &clap::Command, matches: &clap::ArgMatches) -> ExitCode {
    use watchbridge::config::effective;
    if args.config_check {
        return match check_run(&args.run) {
            Ok(_) => {
                println!("configuration OK");
                ExitCode::SUCCESS
            }
            Err(code) => code,
        };
    }
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let settings = effective::grouped(effective::settings(command, matches, &env));
    match args.config_format {
        ConfigFormat::Text => print!("{}", effective::to_text(&settings)),
        ConfigFormat::Json => print!("{}", effective::to_json(&settings)),
    }
    // Shown, not refused: `--check` refuses them.
    let known = watchbridge::config::known::known_names();
    for e in watchbridge::config::known::unknown_variables(env, &known) {
        eprintln!("warning: {e}");
    }
    ExitCode::SUCCESS
}

/// `watchbridge` alone, or with only flags, means `watchbridge run`.
fn with_default_subcommand(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.collect();
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let is_top_level_flag = matches!(first, "-h" | "--help" | "-V" | "--version" | "help");
    if args.len() == 1 || (first.starts_with('-') && !is_top_level_flag) {
        args.insert(1, "run".into());
    }
    args
}

/// `watchbridge state inspect`: JSON lines on stdout, a count on stderr.
fn state_inspect(
    brokers: &str,
    topic: &str,
    key: Option<String>,
    partition: Option<i32>,
    hashes: bool,
) -> ExitCode {
    use watchbridge::kafka::tools::ReadError;
    let options = watchbridge::inspect::Options {
        key: key.map(String::into_bytes),
        partition,
        hashes,
    };
    let mut out = std::io::stdout().lock();
    match watchbridge::inspect::inspect(brokers, topic, &options, &mut out) {
        Ok(s) => {
            eprintln!(
                "{} records read from {topic}, {} printed, {} undecodable",
                s.read, s.printed, s.undecodable
            );
            ExitCode::SUCCESS
        }
        // The reader went away (`| head`): nothing more to say.
        Err(ReadError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `watchbridge broker`: the embedded broker on its own, until Ctrl-C.
fn broker(topics: &[String]) -> ExitCode {
    let broker = match watchbridge::kafka::embedded::EmbeddedBroker::start() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for topic in topics {
        let (name, partitions) = match topic.split_once(':') {
            Some((n, p)) => match p.parse::<i32>() {
                Ok(p) if p > 0 => (n, p),
                _ => {
                    eprintln!(
                        "error: --topic {topic}: the partition count must be a positive number"
                    );
                    return ExitCode::from(2);
                }
            },
            None => (topic.as_str(), 4),
        };
        if let Err(e) = broker.create_topic(name, partitions) {
            eprintln!("error: --topic {topic}: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("{}", broker.bootstrap());
    eprintln!(
        "embedded broker (in memory; it keeps nothing) listening on {}; Ctrl-C stops it.\n\
         try: WATCHBRIDGE_BROKERS={} watchbridge run …   or   kcat -b {} -L",
        broker.bootstrap(),
        broker.bootstrap(),
        broker.bootstrap()
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    ExitCode::SUCCESS
}

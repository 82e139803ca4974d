//! The `watchbridge` command. The Kafka runtime (`run`) arrives with its own issue; today
//! the binary checks termination expressions, polls one input with a built-in poller, and
//! demonstrates the engine.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;
use watchbridge::pollers::builtin::PollerArgs;
use watchbridge::pollers::once::{output_line, PollOnce};
use watchbridge::schedule::{Backoff, Schedule};
use watchbridge::termination::Termination;
use watchbridge::watch::WatchRules;

#[derive(Parser)]
#[command(
    version,
    about = "For every record of an input topic, watch an external resource and emit each new output with its event time"
)]
#[command(arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the watch engine on simulated, growing feeds and print what it emits.
    Demo {
        /// How many inputs (simulated users) to watch.
        #[arg(long, default_value_t = 8)]
        inputs: u32,
        /// When a watch ends, e.g. `any(total(5m), stable(1m))`.
        #[arg(
            long,
            env = "WATCHBRIDGE_TERMINATION",
            default_value = "any(total(10s), stable(3s))"
        )]
        termination: String,
        /// Time between polls of one watch (humantime: 500ms, 10s, 1m).
        #[arg(long, env = "WATCHBRIDGE_POLL_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
        poll_interval: Duration,
        /// Print the engine's Prometheus metrics at the end.
        #[arg(long)]
        metrics: bool,
    },
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
    /// Check a termination expression: print its normal form, or point at the error.
    CheckTermination {
        /// e.g. `any(total(5m), stable(1m))`
        expression: String,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WATCHBRIDGE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
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
        Command::Demo {
            inputs,
            termination,
            poll_interval,
            metrics,
        } => {
            let termination = match termination.parse::<Termination>() {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: WATCHBRIDGE_TERMINATION: {e}");
                    return ExitCode::from(2);
                }
            };
            let schedule = Schedule {
                interval: poll_interval,
                backoff: Some(Backoff {
                    factor: 1.5,
                    max: poll_interval * 4,
                }),
                // Fast retries, so the broken feed visibly ends as `failed`.
                retry: watchbridge::schedule::Retry {
                    initial: poll_interval / 2,
                    max: poll_interval * 2,
                    limit: 3,
                },
                ..Schedule::default()
            };
            if let Err(e) = schedule.validate() {
                eprintln!("error: WATCHBRIDGE_POLL_INTERVAL: {e}");
                return ExitCode::from(2);
            }
            let rules = WatchRules {
                termination,
                schedule,
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let mut stdout = std::io::stdout();
            match runtime.block_on(watchbridge::demo::run(inputs, rules, &mut stdout)) {
                Ok(text) => {
                    if metrics {
                        println!("{text}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: writing output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

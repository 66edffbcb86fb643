//! The commands that talk to a node: one function per command, in [`executions`],
//! [`definitions`], [`cron`], [`access`] (keys, audit, whoami, limits) and [`admin`] (nodes,
//! shards, stats, quarantined, queues). Each returns what to print, or a [`Failure`].

mod access;
mod admin;
mod cron;
mod definitions;
mod executions;

use kairos_sdk::Client;

use crate::args::Api;
use crate::output::{Failure, Opts};

/// The client with the API key, if one was given.
pub(crate) fn with_key(c: Client, key: Option<&str>) -> Result<Client, kairos_sdk::Error> {
    match key.filter(|k| !k.is_empty()) {
        Some(k) => c.with_api_key(k),
        None => Ok(c),
    }
}

/// Runs one command against the node.
pub(crate) async fn run(client: &Client, o: &Opts, cmd: Api) -> Result<String, Failure> {
    match cmd {
        Api::Submit(s) => executions::submit(client, o, s).await,
        Api::Get { execution_id, key } => executions::get(client, o, execution_id, key).await,
        Api::Cancel { execution_id } => executions::cancel(client, o, &execution_id).await,
        Api::Replay { execution_id } => executions::replay(client, o, &execution_id).await,
        Api::Wait { execution_id, timeout } => {
            executions::wait(client, o, &execution_id, timeout).await
        }
        Api::List { status, definition, limit, cursor } => {
            executions::list(client, o, status, definition, limit, cursor).await
        }
        Api::Definitions(d) => definitions::run(client, o, d).await,
        Api::Cron(c) => cron::run(client, o, *c).await,
        Api::Keys(k) => access::keys(client, o, k).await,
        Api::Audit { from, limit, all_namespaces } => {
            access::audit(client, o, from.unwrap_or(0), limit, all_namespaces).await
        }
        Api::Whoami => access::whoami(client, o).await,
        Api::Limits => access::limits(client, o).await,
        Api::Nodes => admin::nodes(client, o).await,
        Api::Shards { space } => admin::shards(client, o, space).await,
        Api::Stats { all } => admin::stats(client, o, all).await,
        Api::Quarantined { limit } => admin::quarantined(client, o, limit).await,
        Api::Queues { all } => admin::queues(client, o, all).await,
    }
}

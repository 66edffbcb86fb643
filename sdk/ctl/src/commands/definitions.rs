//! `definitions apply | get | list`.

use kairos_sdk::Client;
use serde_json::json;

use crate::args::Definitions;
use crate::output::{Failure, Opts, definition_out, table};

/// Runs a `definitions …` command.
pub(super) async fn run(client: &Client, o: &Opts, d: Definitions) -> Result<String, Failure> {
    match d {
        Definitions::Apply { file } => {
            let source = std::fs::read_to_string(&file)
                .map_err(|e| Failure::Other(format!("{}: {e}", file.display())))?;
            let (d, created) = client.register_definition(&source).await?;
            Ok(definition_out(o, &d, Some(created)))
        }
        Definitions::Get { name, version } => {
            let name = name.strip_prefix("registry://jobs/").unwrap_or(&name);
            Ok(definition_out(o, &client.get_definition(name, version).await?, None))
        }
        Definitions::List => {
            let ds = client.list_definitions().await?;
            if o.json {
                let list: Vec<_> = ds.iter().map(kairos_sdk::views::definition).collect();
                return Ok(json!({ "definitions": list }).to_string());
            }
            let rows = ds
                .iter()
                .map(|d| vec![d.name.clone(), d.version.to_string(), d.queue.clone()])
                .collect();
            Ok(table(&["NAME", "VERSION", "QUEUE"], rows))
        }
    }
}

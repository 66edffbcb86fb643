//! The settings table of docs/node.md ("Configuration") against the settings the binary knows:
//! every YAML key of [`NodeConfig`], every `KAIROS_*` variable of [`ENV_VARS`] with the setting
//! it sets, and every flag of `kairos serve` that is a setting. A test; the table itself is
//! written by hand (its defaults and meanings are prose), and this keeps it complete and exact.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    use crate::server::config::{ENV_VARS, NodeConfig};

    const NODE_MD: &str = include_str!("../../../docs/node.md");

    /// The rows of the table: (YAML key, env variable, flag), empty cells as "".
    fn rows() -> Vec<(String, String, String)> {
        let start = NODE_MD.find("| setting (YAML) | env | flag |").expect("the settings table");
        let cell = |c: &str| c.trim().trim_matches('`').to_string();
        NODE_MD[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let c: Vec<&str> = l.split('|').collect();
                (cell(c[1]), cell(c[2]), cell(c[3]))
            })
            .collect()
    }

    /// The YAML keys of [`NodeConfig`], as its deserializer lists them for an unknown one.
    fn yaml_keys() -> BTreeSet<String> {
        let e = serde_yaml_ng::from_str::<NodeConfig>("not_a_setting: 1").unwrap_err().to_string();
        let list = &e[e.find("expected one of").expect("the field list")..];
        list.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    /// Fails naming only what differs: in the docs and not the code, and the other way.
    fn same<T: Ord + std::fmt::Debug>(doc: &BTreeSet<T>, code: &BTreeSet<T>, what: &str) {
        let extra: Vec<_> = doc.difference(code).collect();
        let missing: Vec<_> = code.difference(doc).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{what}: in docs/node.md but not the code: {extra:?}; in the code but not \
             docs/node.md: {missing:?} — fix the table under \"### Configuration\" in docs/node.md"
        );
    }

    #[test]
    fn the_settings_table_in_docs_node_md_matches_the_code() {
        let rows = rows();
        let documented: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
        same(&documented, &yaml_keys(), "YAML keys");
        let env_doc: BTreeSet<(String, String)> =
            rows.iter().filter(|r| !r.1.is_empty()).map(|r| (r.1.clone(), r.0.clone())).collect();
        let env_code: BTreeSet<(String, String)> =
            ENV_VARS.iter().map(|(v, s)| (v.to_string(), s.to_string())).collect();
        same(&env_doc, &env_code, "environment variables (variable, setting)");
        let flags_doc: BTreeSet<String> =
            rows.iter().filter(|r| !r.2.is_empty()).map(|r| r.2.clone()).collect();
        let cli = super::super::Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve");
        let flags_code: BTreeSet<String> = serve
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "config" && *l != "help")
            .map(|l| format!("--{l}"))
            .collect();
        same(&flags_doc, &flags_code, "flags of `kairos serve`");
    }
}

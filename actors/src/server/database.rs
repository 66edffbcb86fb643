//! The database a node writes to, named for people: `/healthz`, `kairosctl nodes` and the
//! start log show it. Never a credential: a PostgreSQL URL loses its user, password and
//! query (which may carry `password=`).

use super::config::{Backend, NodeConfig};

impl NodeConfig {
    /// `embedded:<data_dir>/kv.redb`, `memory`, `fdb:<cluster file or default>`,
    /// `postgres://host:port,…/db schema=<schema>`.
    pub fn database_label(&self) -> String {
        match self.backend {
            Backend::Embedded => format!("embedded:{}", self.data_dir.join("kv.redb").display()),
            Backend::Memory => "memory".to_string(),
            Backend::Fdb => {
                format!("fdb:{}", self.fdb_cluster_file.as_deref().unwrap_or("default"))
            }
            Backend::Postgres => {
                let url = self.postgres_url.as_deref().unwrap_or_default();
                format!("{} schema={}", postgres_without_secrets(url), self.postgres_schema)
            }
        }
    }
}

/// `postgresql://user:pw@db1:5432,db2/k?sslmode=…` → `postgres://db1:5432,db2/k`;
/// `host=db1 port=5432 dbname=k password=…` → `postgres://db1:5432/k`.
fn postgres_without_secrets(url: &str) -> String {
    let rest = url.strip_prefix("postgresql://").or_else(|| url.strip_prefix("postgres://"));
    let Some(rest) = rest else {
        let word =
            |k: &str| url.split_whitespace().find_map(|w| w.strip_prefix(k).map(str::to_string));
        let host = word("host=").unwrap_or_else(|| "localhost".into());
        let port = word("port=").map(|p| format!(":{p}")).unwrap_or_default();
        return format!("postgres://{host}{port}/{}", word("dbname=").unwrap_or_default());
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("postgres://{hosts}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_credential_survives() {
        let cases = [
            (
                "postgresql://kairos:s3cret@db1:5432,db2:5432/k?sslmode=require",
                "postgres://db1:5432,db2:5432/k",
            ),
            ("postgres://db1/k", "postgres://db1/k"),
            ("postgres://u@db1", "postgres://db1/"),
            ("host=db1 port=6432 dbname=k user=u password=s3cret", "postgres://db1:6432/k"),
            ("dbname=k password=s3cret", "postgres://localhost/k"),
        ];
        for (url, want) in cases {
            assert_eq!(postgres_without_secrets(url), want, "{url}");
        }
    }

    #[test]
    fn each_backend_is_named() {
        let mut c = NodeConfig::default();
        assert_eq!(c.database_label(), "embedded:kairos-data/kv.redb");
        c.backend = Backend::Postgres;
        c.postgres_url = Some("postgresql://u:p@db:5432/kairos".into());
        assert_eq!(c.database_label(), "postgres://db:5432/kairos schema=kairos");
        c.backend = Backend::Memory;
        assert_eq!(c.database_label(), "memory");
    }
}

//! `DefinitionService`: register (bounded by the namespace's `definition_bytes_max`, parsed
//! off the request threads), get, list.

use kairos_proto::v1::definition_service_server::DefinitionService;
use kairos_proto::v1::*;
use tonic::Request;

use super::{Api, Reply, convert, ok, or_default, status};
use crate::server::auth::Scope;

#[tonic::async_trait]
impl DefinitionService for Api {
    async fn register(
        &self,
        req: Request<RegisterDefinitionRequest>,
    ) -> Reply<RegisterDefinitionResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Definitions).await?;
        let r = req.into_inner();
        self.node
            .check_definition_size(&or_default(&r.namespace), r.source.len())
            .map_err(|e| status(&e))?;
        let def =
            crate::api::parse_definition(r.source.into_bytes()).await.map_err(|e| status(&e))?;
        let (d, created) = self
            .node
            .scheduler()
            .register_definition(&or_default(&r.namespace), def, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(RegisterDefinitionResponse { definition: Some(convert::definition(&d)), created })
    }

    async fn get(&self, req: Request<GetDefinitionRequest>) -> Reply<DefinitionResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let version = (r.version != 0).then_some(r.version);
        let d = self
            .node
            .scheduler()
            .get_definition(&or_default(&r.namespace), &r.name, version)
            .await
            .map_err(|e| status(&e))?;
        ok(DefinitionResponse { definition: Some(convert::definition(&d)) })
    }

    async fn list(&self, req: Request<ListDefinitionsRequest>) -> Reply<ListDefinitionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let ds = self
            .node
            .scheduler()
            .list_definitions(&or_default(&r.namespace))
            .await
            .map_err(|e| status(&e))?;
        ok(ListDefinitionsResponse { definitions: ds.iter().map(convert::definition).collect() })
    }
}

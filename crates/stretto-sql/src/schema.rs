//! Every bundled dataset as a SQL schema: `SELECT ... FROM movie.reviews`. A table is read on first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use stretto::core::datasets::{self, DatasetSpec};

#[derive(Debug)]
struct BundledSchema {
    spec: &'static DatasetSpec,
    loaded: Mutex<HashMap<String, Arc<MemTable>>>,
}

#[async_trait]
impl SchemaProvider for BundledSchema {
    fn table_names(&self) -> Vec<String> {
        self.spec.tables.iter().map(|t| t.name.to_string()).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(t) = self.spec.tables.iter().find(|t| t.name == name) else { return Ok(None) };
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = loaded.get(name) {
            return Ok(Some(m.clone()));
        }
        let external = |e: stretto::core::CoreError| DataFusionError::External(Box::new(e));
        let batch = datasets::load_table(t, &datasets::data_dir().map_err(external)?).map_err(external)?;
        let table = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?);
        loaded.insert(name.to_string(), table.clone());
        Ok(Some(table))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.spec.tables.iter().any(|t| t.name == name)
    }
}

/// Registers every bundled dataset as a schema of the default catalog.
pub(crate) fn register_bundled(ctx: &SessionContext) -> Result<()> {
    let catalog = ctx
        .catalog(&ctx.copied_config().options().catalog.default_catalog)
        .ok_or_else(|| DataFusionError::Plan("the default catalog is missing".into()))?;
    for spec in datasets::DATASETS {
        catalog.register_schema(spec.name, Arc::new(BundledSchema { spec, loaded: Mutex::default() }))?;
    }
    Ok(())
}

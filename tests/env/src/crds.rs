//! The CRDs exactly as deploy/ has them, except where the conversion webhook
//! is: the apiserver here cannot route to a Service (EndpointSlices refuse
//! 127.0.0.0/8), so they name the operators' shared loopback URL instead.

use std::path::Path;

use serde::Deserialize;

/// deploy/crds/*.yaml as one YAML stream, each CRD's conversion webhook at `url`.
pub fn with_webhook_url(root: &Path, url: &str) -> anyhow::Result<String> {
    let mut documents = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(root.join("deploy/crds"))?.collect::<Result<_, _>>()?;
    files.sort_by_key(|entry| entry.path());
    for file in files {
        let text = std::fs::read_to_string(file.path())?;
        for document in serde_norway::Deserializer::from_str(&text) {
            let mut crd = serde_norway::Value::deserialize(document)?;
            if let Some(client_config) = crd
                .get_mut("spec")
                .and_then(|spec| spec.get_mut("conversion"))
                .and_then(|conversion| conversion.get_mut("webhook"))
                .and_then(|webhook| webhook.get_mut("clientConfig"))
            {
                *client_config = serde_norway::to_value(std::collections::BTreeMap::from([("url", url)]))?;
            }
            documents.push(serde_norway::to_string(&crd)?);
        }
    }
    Ok(documents.join("---\n"))
}

/// The URL of the conversion webhook that every operator started here
/// serves on `port` (they share it, as replicas share a Service).
pub fn webhook_url(port: u16) -> String {
    format!("https://127.0.0.1:{port}/convert")
}

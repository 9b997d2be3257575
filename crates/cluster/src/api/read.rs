//! Reads: one object, or a list selected by labels and fields and cut into pages with
//! continue tokens.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Value, json};

use super::{Api, ListOptions, ListPage};
use crate::errors::ApiError;
use crate::resources::Resource;
use crate::store::StoredObject;

impl Api {
    /// GET of one object.
    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Result<Bytes, ApiError> {
        let stored = self
            .store
            .get(&Self::key(resource, namespace, name))
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        Ok(self.present(resource, &stored))
    }

    /// GET of one object, parsed.
    pub fn get_value(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let bytes = self.get(resource, namespace, name)?;
        serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(e.to_string()))
    }

    /// LIST of one namespace (or all, with `None`).
    pub fn list(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let after = options
            .continue_token
            .as_deref()
            .map(decode_continue)
            .transpose()?;
        let namespace = namespace.filter(|_| resource.namespaced);
        let selects = |o: &StoredObject| options.selects(&o.projection);
        let page = self.store.list(
            &resource.storage,
            namespace,
            after.as_ref(),
            options.limit.filter(|l| *l > 0),
            options
                .filters()
                .then_some(&selects as &dyn Fn(&StoredObject) -> bool),
        );
        Ok(ListPage {
            items: page
                .items
                .iter()
                .map(|o| self.present(resource, o))
                .collect(),
            resource_version: page.resource_version,
            continue_token: page
                .next
                .map(|position| encode_continue(page.resource_version, &position)),
            remaining: page.remaining,
        })
    }

    /// LIST, parsed (for in-process callers).
    pub fn list_values(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<Vec<Value>, ApiError> {
        self.list(resource, namespace, options)?
            .items
            .iter()
            .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(e.to_string())))
            .collect()
    }
}

fn encode_continue(resource_version: u64, position: &(String, String)) -> String {
    let token = json!({"rv": resource_version, "ns": position.0, "name": position.1});
    base64::engine::general_purpose::STANDARD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let invalid = || {
        ApiError::bad_request("continue key is not valid: the token was not issued by this server")
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| invalid())?;
    let token: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let field = |f: &str| token.get(f).and_then(Value::as_str).map(str::to_string);
    Ok((
        field("ns").ok_or_else(invalid)?,
        field("name").ok_or_else(invalid)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let position = ("default".to_string(), "pod-7".to_string());
        let token = encode_continue(42, &position);
        assert_eq!(decode_continue(&token).expect("decode"), position);
        assert_eq!(decode_continue("%%%").map_err(|e| e.code), Err(400));
    }
}

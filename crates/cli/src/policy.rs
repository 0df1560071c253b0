//! `tributary policy`: the shared access policies of the namespace and of each event hub, where
//! `tributary hub` works ([`Catalog`]): on the data directory's policies file when no server
//! holds it, else through the running server's admin API (`/admin/v1/policies`,
//! `/admin/v1/hubs/{hub}/policies`), which changes the server's live set — in force on every
//! door at once, with no restart — and saves it. This process never writes the file of a data
//! directory a server holds.
//!
//! Keys are printed only by `show --keys` and `list --keys`; `rotate` says which key changed,
//! not its value. [`follow_hubs`] keeps a hub's policies from outliving the hub.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use hyper::Method;
use serde_json::{Value, json};
use tributary_amqp::Right;
use tributary_amqp::policies::{self, AccessPolicies, AccessPolicy, KeyType, Scope};
use tributary_broker::Broker;

use crate::admin::{Admin, Catalog};
use crate::args::{GlobalArgs, PolicyArgs, PolicyCommand};
use crate::running;

/// Makes `policies` follow the hubs of `broker`: a hub's policies are deleted with it (and
/// those of hubs already gone, say deleted while a crash kept the policies from following, are
/// deleted now), and every policy without a secondary key gets one.
pub fn follow_hubs(broker: &Broker, policies: &AccessPolicies) -> Result<()> {
    let hubs: Vec<String> = broker.list_hubs().into_iter().map(|h| h.name).collect();
    for gone in policies.retain_hubs(&hubs)? {
        tracing::info!(hub = %gone, "deleted the shared access policies of an event hub that no longer exists");
    }
    let completed = policies.complete_keys()?;
    if completed > 0 {
        tracing::info!(
            policies = completed,
            "gave a secondary key to policies that had none"
        );
    }
    let following = policies.clone();
    broker.on_hub_deleted(move |hub| match following.delete_hub(hub) {
        Ok(0) => {}
        Ok(count) => tracing::info!(hub, policies = count, "deleted the event hub's shared access policies"),
        Err(e) => tracing::warn!(hub, error = %e, "cannot delete the event hub's shared access policies; the next start does"),
    });
    Ok(())
}

/// Deletes the policies of the hub `hub` of the data directory `data_dir` (a hub deleted
/// without a server), if it has a policies file.
pub fn forget_hub(data_dir: &Path, hub: &str) -> Result<()> {
    if !data_dir.join(policies::POLICIES_FILE).exists() {
        return Ok(());
    }
    let (policies, _) = AccessPolicies::load_or_create(data_dir)?;
    policies.delete_hub(hub)?;
    Ok(())
}

/// A policy as the commands print it: keys only when asked for.
struct PolicyView {
    name: String,
    rights: Vec<Right>,
    /// The primary and the secondary key.
    keys: Option<(String, Option<String>)>,
}

impl PolicyView {
    fn of(policy: &AccessPolicy, keys: bool) -> Self {
        PolicyView {
            name: policy.name.clone(),
            rights: policy.rights.clone(),
            keys: keys.then(|| (policy.key.clone(), policy.secondary_key.clone())),
        }
    }

    fn from_json(policy: &Value) -> Result<Self> {
        let bad = || anyhow::anyhow!("the admin API described a policy in an unexpected form");
        let rights = policy["rights"].as_array().ok_or_else(bad)?;
        Ok(PolicyView {
            name: policy["name"].as_str().ok_or_else(bad)?.to_owned(),
            rights: rights
                .iter()
                .map(|r| {
                    r.as_str()
                        .ok_or_else(bad)?
                        .parse()
                        .map_err(anyhow::Error::from)
                })
                .collect::<Result<_>>()?,
            keys: None,
        })
    }

    fn with_keys(mut self, keys: &Value) -> Result<Self> {
        let primary = keys["primaryKey"]
            .as_str()
            .context("the admin API answered without the primary key")?;
        let secondary = keys["secondaryKey"].as_str().map(str::to_owned);
        self.keys = Some((primary.to_owned(), secondary));
        Ok(self)
    }

    fn rights_text(&self) -> String {
        let rights: Vec<String> = self.rights.iter().map(Right::to_string).collect();
        rights.join(",")
    }
}

/// Where the policies are: the data directory's file (its broker held, so no server changes
/// it meanwhile), or a server's admin API.
enum Policies {
    Local(Broker, AccessPolicies),
    Server(Admin),
}

/// The admin API's path of `scope`'s policies (and of one of them).
fn api_path(scope: &Scope, name: Option<&str>) -> String {
    let base = match scope.hub() {
        None => "/admin/v1/policies".to_owned(),
        Some(hub) => format!("/admin/v1/hubs/{}/policies", crate::admin::segment(hub)),
    };
    match name {
        None => base,
        Some(name) => format!("{base}/{}", crate::admin::segment(name)),
    }
}

impl Policies {
    async fn open(global: &GlobalArgs, args: &PolicyArgs) -> Result<Policies> {
        Ok(match Catalog::open(global, &args.remote).await? {
            Catalog::Server(admin) => Policies::Server(admin),
            Catalog::Local(broker) => {
                let loaded = AccessPolicies::load_or_create(&global.data_dir)
                    .context("cannot load the shared access policies")
                    .and_then(|(policies, _)| {
                        follow_hubs(&broker, &policies)?;
                        Ok(policies)
                    });
                match loaded {
                    Ok(policies) => Policies::Local(broker, policies),
                    Err(e) => {
                        broker.shutdown().await?;
                        return Err(e);
                    }
                }
            }
        })
    }

    async fn close(self) -> Result<()> {
        if let Policies::Local(broker, _) = self {
            broker.shutdown().await?;
        }
        Ok(())
    }

    /// The scope `hub` names, the hub spelt as it is (an unknown hub is an error).
    async fn scope(&self, hub: Option<&str>) -> Result<Scope> {
        let Some(hub) = hub else {
            return Ok(Scope::Namespace);
        };
        Ok(Scope::Hub(match self {
            Policies::Local(broker, _) => broker.describe_hub(hub)?.name,
            Policies::Server(admin) => {
                let path = format!("/admin/v1/hubs/{}", crate::admin::segment(hub));
                let answer = admin.call(Method::GET, &path, None).await?;
                answer["name"].as_str().unwrap_or(hub).to_owned()
            }
        }))
    }

    async fn list(&self, scope: &Scope, keys: bool) -> Result<Vec<PolicyView>> {
        match self {
            Policies::Local(_, policies) => Ok(policies
                .list(scope)
                .iter()
                .map(|p| PolicyView::of(p, keys))
                .collect()),
            Policies::Server(admin) => {
                let answer = admin
                    .call(Method::GET, &api_path(scope, None), None)
                    .await?;
                let listed = answer["policies"].as_array().map_or(&[][..], Vec::as_slice);
                let mut views = Vec::with_capacity(listed.len());
                for policy in listed {
                    let view = PolicyView::from_json(policy)?;
                    views.push(match keys {
                        true => self.keys_of(scope, view).await?,
                        false => view,
                    });
                }
                Ok(views)
            }
        }
    }

    /// `view` with its keys, asked of the server.
    async fn keys_of(&self, scope: &Scope, view: PolicyView) -> Result<PolicyView> {
        let Policies::Server(admin) = self else {
            return Ok(view);
        };
        let path = format!("{}/keys", api_path(scope, Some(&view.name)));
        view.with_keys(&admin.call(Method::POST, &path, None).await?)
    }

    async fn show(&self, scope: &Scope, name: &str, keys: bool) -> Result<PolicyView> {
        match self {
            Policies::Local(_, policies) => Ok(PolicyView::of(&policies.find(scope, name)?, keys)),
            Policies::Server(admin) => {
                let answer = admin
                    .call(Method::GET, &api_path(scope, Some(name)), None)
                    .await?;
                let view = PolicyView::from_json(&answer)?;
                match keys {
                    true => self.keys_of(scope, view).await,
                    false => Ok(view),
                }
            }
        }
    }

    async fn create(&self, scope: &Scope, name: &str, rights: &[Right]) -> Result<PolicyView> {
        match self {
            Policies::Local(_, policies) => Ok(PolicyView::of(
                &policies.create(scope, name, rights.to_vec())?,
                false,
            )),
            Policies::Server(admin) => {
                let rights: Vec<String> = rights.iter().map(Right::to_string).collect();
                let body = json!({ "name": name, "rights": rights });
                let answer = admin
                    .call(Method::POST, &api_path(scope, None), Some(body))
                    .await?;
                PolicyView::from_json(&answer)
            }
        }
    }

    async fn rotate(&self, scope: &Scope, name: &str, which: KeyType) -> Result<()> {
        match self {
            Policies::Local(_, policies) => policies.rotate(scope, name, which).map(drop)?,
            Policies::Server(admin) => {
                let path = format!("{}/regenerate", api_path(scope, Some(name)));
                let key_type = match which {
                    KeyType::Primary => "PrimaryKey",
                    KeyType::Secondary => "SecondaryKey",
                };
                let body = json!({ "keyType": key_type });
                admin
                    .call(Method::POST, &path, Some(body))
                    .await
                    .map(drop)?;
            }
        }
        Ok(())
    }

    async fn delete(&self, scope: &Scope, name: &str) -> Result<()> {
        match self {
            Policies::Local(_, policies) => policies.delete(scope, name)?,
            Policies::Server(admin) => {
                admin
                    .call(Method::DELETE, &api_path(scope, Some(name)), None)
                    .await
                    .map(drop)?;
            }
        }
        Ok(())
    }
}

/// `tributary policy …`.
pub async fn run(global: &GlobalArgs, args: &PolicyArgs) -> Result<()> {
    let policies = Policies::open(global, args).await?;
    let result = act(global, args, &policies).await;
    policies.close().await?;
    result
}

async fn act(global: &GlobalArgs, args: &PolicyArgs, policies: &Policies) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let endpoint = || endpoint(global, args);
    match &args.command {
        PolicyCommand::Create { target, rights } => {
            let scope = policies.scope(target.hub.as_deref()).await?;
            let created = policies.create(&scope, &target.name, rights).await?;
            writeln!(
                out,
                "created the shared access policy {:?} ({}) in {scope}; `tributary policy show {}{} --keys` prints its keys",
                created.name,
                created.rights_text(),
                created.name,
                hub_flag(&scope)
            )?;
        }
        PolicyCommand::List { hub, keys } => {
            let scope = policies.scope(hub.as_deref()).await?;
            for view in policies.list(&scope, *keys).await? {
                write_policy(&mut out, &view, &scope, endpoint(), false)?;
            }
        }
        PolicyCommand::Show { target, keys } => {
            let scope = policies.scope(target.hub.as_deref()).await?;
            let view = policies.show(&scope, &target.name, *keys).await?;
            write_policy(&mut out, &view, &scope, endpoint(), true)?;
        }
        PolicyCommand::Rotate { target, key } => {
            let scope = policies.scope(target.hub.as_deref()).await?;
            policies.rotate(&scope, &target.name, *key).await?;
            writeln!(
                out,
                "regenerated the {key} key of the shared access policy {:?} in {scope}: tokens and logins with the old one are refused from now on; `tributary policy show {}{} --keys` prints the new one",
                target.name,
                target.name,
                hub_flag(&scope)
            )?;
        }
        PolicyCommand::Delete { target } => {
            let scope = policies.scope(target.hub.as_deref()).await?;
            policies.delete(&scope, &target.name).await?;
            writeln!(
                out,
                "deleted the shared access policy {:?} from {scope}",
                target.name
            )?;
        }
    }
    Ok(())
}

fn hub_flag(scope: &Scope) -> String {
    scope
        .hub()
        .map_or_else(String::new, |hub| format!(" --hub {hub}"))
}

/// Where connection strings point: the server running on the data directory, the remote hub
/// of --connection-string, else localhost:5672 (host, port, TLS).
fn endpoint(global: &GlobalArgs, args: &PolicyArgs) -> (String, u16, bool) {
    if let Some(cs) = &args.remote.connection_string
        && let Ok(cs) = tributary_client::ConnectionString::parse(cs)
    {
        return (cs.host().to_owned(), cs.port(), cs.uses_tls());
    }
    running::find(&global.data_dir)
        .and_then(|l| l.amqp_endpoint())
        .unwrap_or_else(|| ("localhost".to_owned(), policies::DEFAULT_PORT, false))
}

/// One policy: a line (`name<TAB>rights<TAB>scope`), or with `detailed` a line per field; its
/// keys and connection strings when it has them.
fn write_policy(
    out: &mut impl Write,
    view: &PolicyView,
    scope: &Scope,
    (host, port, tls): (String, u16, bool),
    detailed: bool,
) -> Result<()> {
    if detailed {
        writeln!(
            out,
            "name: {}\nscope: {scope}\nrights: {}",
            view.name,
            view.rights_text()
        )?;
    } else {
        writeln!(out, "{}\t{}\t{scope}", view.name, view.rights_text())?;
    }
    let Some((primary, secondary)) = &view.keys else {
        return Ok(());
    };
    let policy = AccessPolicy {
        name: view.name.clone(),
        key: primary.clone(),
        secondary_key: secondary.clone(),
        rights: view.rights.clone(),
    };
    for which in [KeyType::Primary, KeyType::Secondary] {
        let Some(key) = policy.key_of(which) else {
            continue;
        };
        let text = policies::policy_connection_string(&host, port, tls, &policy, scope, which)
            .expect("the policy has this key");
        writeln!(
            out,
            "  {which} key: {key}\n  {which} connection string: {text}"
        )?;
    }
    Ok(())
}

//! Shared access policies: named keys with rights, as Event Hubs has them — on the namespace
//! and on each event hub.
//!
//! A policy has a name (the `SharedAccessKeyName` of a connection string), two keys (primary and
//! secondary, the `SharedAccessKey`; either signs, each used as-is — its UTF-8 bytes — exactly as
//! the SDKs do) and rights: [`Right::Listen`] to receive, [`Right::Send`] to send,
//! [`Right::Manage`] for everything.
//!
//! # Scopes
//! A policy lives on the namespace or on one event hub ([`Scope`]); names are unique within a
//! scope. A namespace policy grants its rights wherever its token's audience (`sr`) points. A hub
//! policy proves only tokens whose audience is that hub or below it (`sb://host/<hub>[/…]`), and
//! a SASL PLAIN login or connection string with its key grants that hub only: a token it signed
//! for another hub or for the namespace is refused ([`TokenRefused::OutsideHub`]). Its connection
//! string carries `EntityPath=<hub>`, as the portal gives it.
//!
//! # Live changes
//! [`AccessPolicies`] is a handle: every clone shares one policy set, which [`AccessPolicies::create`],
//! [`AccessPolicies::rotate`] and [`AccessPolicies::delete`] replace as a whole (saved first when
//! the set came from a file), so every door sees a change on its next login or token at once, with
//! no restart. Once a key is regenerated, a token or login with the old key is refused; grants a
//! connection already holds are not revoked (a token's grant lasts until the token expires, a
//! PLAIN login's until the connection closes), as in Event Hubs.
//!
//! # Persistence
//! The policies live in `<data_dir>/access-policies.json` (`version`: the file's format, 1;
//! `policies`: the namespace's; `hubs`: each hub's by name), written atomically (a temporary file, `fsync`, rename, `fsync` of the
//! directory) with mode 0600 because it holds keys. Only the process holding the data directory
//! (`serve`, or a CLI command when no server runs) changes it. [`AccessPolicies::load_or_create`]
//! creates the file on first start with a `RootManageSharedAccessKey` policy holding random
//! 32-byte keys and returns its connection string once, so the operator can copy it. A policies
//! file readable by group or others is refused with an error naming it and the `chmod 600` that
//! fixes it (the rule and wording of the editor's key files, `tributary-edit`'s `steps::keys`,
//! which this crate cannot depend on). A file written before policies had secondary keys loads;
//! [`AccessPolicies::complete_keys`] gives them one.
//!
//! # Keys accepted for one run only
//! [`AccessPolicies::accepting_unsaved`] adds a namespace policy that is accepted but never saved:
//! `serve --emulator-compat` adds Microsoft's Event Hubs emulator's publicly known key
//! ([`AccessPolicy::emulator_well_known`]) that way, so it is accepted only while that flag is
//! given, and never lands in the file. Such a policy may share its name with a saved one (the
//! emulator's key name is `RootManageSharedAccessKey`, as is the root policy's): a token or a
//! PLAIN login is accepted when any key of that name proves it, and gets the rights of the policy
//! whose key proved it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use base64::Engine;
use serde::{Deserialize, Serialize};

use tributary_event::format::check_format_version;
use tributary_eventhubs::sas;

use crate::AmqpError;
use crate::limits::POLICIES_PER_SCOPE_MAX;

/// The file, inside the broker's data directory, that holds the policies.
pub const POLICIES_FILE: &str = "access-policies.json";

/// The name of the policy created on first start, as in every Event Hubs namespace.
pub const ROOT_POLICY: &str = "RootManageSharedAccessKey";

/// The key name in the connection string Microsoft's Event Hubs emulator documents
/// (`Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;`).
pub const EMULATOR_KEY_NAME: &str = "RootManageSharedAccessKey";

/// The key in that connection string: the same for every emulator, published in its README,
/// so anyone can sign with it. Accepted only by `serve --emulator-compat`.
pub const EMULATOR_KEY: &str = "SAS_KEY_VALUE";

/// The port a connection string names when the caller has no other: the AMQP port.
pub const DEFAULT_PORT: u16 = 5672;

/// What a policy allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Right {
    /// Receive events and read hub and partition properties.
    Listen,
    /// Send events (and read hub and partition properties, which producers need first).
    Send,
    /// Everything: includes Listen and Send.
    Manage,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Right::Listen => "Listen",
            Right::Send => "Send",
            Right::Manage => "Manage",
        })
    }
}

impl std::str::FromStr for Right {
    type Err = AmqpError;

    /// `Listen`, `Send` or `Manage`, in any case.
    fn from_str(text: &str) -> Result<Self, AmqpError> {
        [Right::Listen, Right::Send, Right::Manage]
            .into_iter()
            .find(|r| r.to_string().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| {
                AmqpError::InvalidPolicy(format!(
                    "{text:?} is not a right; the rights are Listen, Send and Manage"
                ))
            })
    }
}

/// Where a policy lives: the namespace, or one event hub (named as the hub spells it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The whole namespace.
    Namespace,
    /// One event hub.
    Hub(String),
}

impl Scope {
    /// The event hub, for a hub's policy.
    pub fn hub(&self) -> Option<&str> {
        match self {
            Scope::Namespace => None,
            Scope::Hub(hub) => Some(hub),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Namespace => f.write_str("the namespace"),
            Scope::Hub(hub) => write!(f, "event hub {hub:?}"),
        }
    }
}

/// Which of a policy's two keys (Event Hubs' `PrimaryKey` and `SecondaryKey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// The primary key: what connection strings carry unless told otherwise.
    Primary,
    /// The secondary key: what clients move to while the primary is regenerated.
    Secondary,
}

impl std::fmt::Display for KeyType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyType::Primary => "primary",
            KeyType::Secondary => "secondary",
        })
    }
}

impl std::str::FromStr for KeyType {
    type Err = AmqpError;

    /// `primary` or `secondary` (also Azure's `PrimaryKey` and `SecondaryKey`), in any case.
    fn from_str(text: &str) -> Result<Self, AmqpError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "primary" | "primarykey" => Ok(KeyType::Primary),
            "secondary" | "secondarykey" => Ok(KeyType::Secondary),
            _ => Err(AmqpError::InvalidPolicy(format!(
                "{text:?} is not a key; say primary or secondary"
            ))),
        }
    }
}

/// One shared access policy.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessPolicy {
    /// Its name (`SharedAccessKeyName`).
    pub name: String,
    /// Its primary key (`SharedAccessKey`): the text whose UTF-8 bytes sign tokens.
    pub key: String,
    /// Its secondary key, which signs as well; `None` only in a file written before policies
    /// had one (see [`AccessPolicies::complete_keys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_key: Option<String>,
    /// What it allows.
    pub rights: Vec<Right>,
}

impl std::fmt::Debug for AccessPolicy {
    // Never print a key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessPolicy")
            .field("name", &self.name)
            .field("key", &"<redacted>")
            .field(
                "secondary_key",
                &self.secondary_key.as_ref().map(|_| "<redacted>"),
            )
            .field("rights", &self.rights)
            .finish()
    }
}

/// A fresh random 32-byte key (base64) from the operating system's CSPRNG, as the portal makes
/// them.
fn random_key() -> Result<String, AmqpError> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| AmqpError::Random(e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(raw))
}

impl AccessPolicy {
    /// A policy with fresh random primary and secondary keys.
    pub fn generate(name: impl Into<String>, rights: Vec<Right>) -> Result<Self, AmqpError> {
        Ok(AccessPolicy {
            name: name.into(),
            key: random_key()?,
            secondary_key: Some(random_key()?),
            rights,
        })
    }

    /// The policy the Event Hubs emulator's well-known connection string signs with:
    /// [`EMULATOR_KEY_NAME`] with [`EMULATOR_KEY`], with the Manage right (the emulator's key
    /// can do everything). Publicly known: add it only with
    /// [`AccessPolicies::accepting_unsaved`], for development.
    pub fn emulator_well_known() -> Self {
        AccessPolicy {
            name: EMULATOR_KEY_NAME.to_owned(),
            key: EMULATOR_KEY.to_owned(),
            secondary_key: None,
            rights: vec![Right::Manage],
        }
    }

    /// Whether the policy grants `right` (Manage grants everything).
    pub fn allows(&self, right: Right) -> bool {
        self.rights.contains(&right) || self.rights.contains(&Right::Manage)
    }

    /// The key `which`, if the policy has it.
    pub fn key_of(&self, which: KeyType) -> Option<&str> {
        match which {
            KeyType::Primary => Some(&self.key),
            KeyType::Secondary => self.secondary_key.as_deref(),
        }
    }

    /// Every key that signs for it: the primary, then the secondary.
    fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str()).chain(self.secondary_key.as_deref())
    }
}

/// What proved a token or a login: a policy's name, rights and scope — never its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The policy's name.
    pub name: String,
    /// Its rights.
    pub rights: Vec<Right>,
    /// Where it lives: what it may grant.
    pub scope: Scope,
}

impl Signer {
    fn of(policy: &AccessPolicy, scope: &Scope) -> Self {
        Signer {
            name: policy.name.clone(),
            rights: policy.rights.clone(),
            scope: scope.clone(),
        }
    }

    /// Whether it grants `right` (Manage grants everything).
    pub fn allows(&self, right: Right) -> bool {
        self.rights.contains(&right) || self.rights.contains(&Right::Manage)
    }
}

/// Why a SAS token was refused. The text never contains the token or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenRefused {
    /// Malformed, expired, or signed with a key name no policy has.
    #[error(transparent)]
    Sas(#[from] sas::SasError),
    /// Signed with neither key of the policy it names: a wrong key, or one regenerated since.
    #[error(
        "the token's signature matches neither the primary nor the secondary key of the shared \
         access policy {key_name:?}; if its key was regenerated, sign with the current one \
         (`tributary policy show {key_name} --keys`)"
    )]
    WrongKey {
        /// The policy's name.
        key_name: String,
    },
    /// Signed with an event hub's policy for an audience outside that hub.
    #[error(
        "the shared access policy {key_name:?} belongs to event hub {hub:?}: it signs tokens for \
         that event hub only (sr=sb://<host>/{hub}), not for {audience:?}; use a policy of the \
         namespace or of the hub you address"
    )]
    OutsideHub {
        /// The policy's name.
        key_name: String,
        /// Its event hub.
        hub: String,
        /// The token's audience.
        audience: String,
    },
}

/// The policies of the namespace and of each event hub: what the file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PolicySet {
    /// The namespace's policies.
    policies: Vec<AccessPolicy>,
    /// Each event hub's policies, by the hub's name as it spells it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    hubs: BTreeMap<String, Vec<AccessPolicy>>,
    /// Namespace policies accepted for this process only; never saved, never listed.
    #[serde(skip)]
    unsaved: Vec<AccessPolicy>,
}

/// Checks one scope's policies: names unique (case-sensitive, as in Event Hubs) and valid, each
/// with a key and at least one right, at most [`POLICIES_PER_SCOPE_MAX`].
fn check_scope(scope: &Scope, policies: &[AccessPolicy]) -> Result<(), AmqpError> {
    let invalid = |what: String| Err(AmqpError::InvalidPolicy(format!("{scope}: {what}")));
    if policies.len() > POLICIES_PER_SCOPE_MAX {
        return invalid(format!(
            "{} policies; at most {POLICIES_PER_SCOPE_MAX} are allowed, as in Event Hubs",
            policies.len()
        ));
    }
    for (index, policy) in policies.iter().enumerate() {
        if policy.name.is_empty() || policy.name.len() > 256 {
            return invalid(format!(
                "policy {index}: the name must have 1 to 256 characters"
            ));
        }
        if policy.name.contains([';', '=']) || policy.name.chars().any(char::is_control) {
            return invalid(format!(
                "policy {:?}: the name may not contain ';', '=' or control characters",
                policy.name
            ));
        }
        if policy.key.is_empty() || policy.secondary_key.as_deref() == Some("") {
            return invalid(format!("policy {:?} has an empty key", policy.name));
        }
        if policy.rights.is_empty() {
            return invalid(format!("policy {:?} has no rights", policy.name));
        }
        if policies[..index].iter().any(|p| p.name == policy.name) {
            return invalid(format!("policy {:?} is defined twice", policy.name));
        }
    }
    Ok(())
}

impl PolicySet {
    fn check(&self) -> Result<(), AmqpError> {
        check_scope(&Scope::Namespace, &self.policies)?;
        for (hub, policies) in &self.hubs {
            if hub.is_empty() {
                return Err(AmqpError::InvalidPolicy("a hub's name is empty".into()));
            }
            check_scope(&Scope::Hub(hub.clone()), policies)?;
        }
        Ok(())
    }

    /// The hub's entry: its name as stored, whatever case `hub` has.
    fn hub_key(&self, hub: &str) -> Option<&String> {
        self.hubs.keys().find(|h| h.eq_ignore_ascii_case(hub))
    }

    /// The saved policies of `scope`.
    fn scope(&self, scope: &Scope) -> &[AccessPolicy] {
        match scope.hub() {
            None => &self.policies,
            Some(hub) => self
                .hub_key(hub)
                .and_then(|h| self.hubs.get(h))
                .map_or(&[], Vec::as_slice),
        }
    }

    /// The saved policies of `scope`, to change (a hub's entry is made when missing).
    fn scope_mut(&mut self, scope: &Scope) -> &mut Vec<AccessPolicy> {
        match scope.hub() {
            None => &mut self.policies,
            Some(hub) => {
                let key = self.hub_key(hub).cloned().unwrap_or_else(|| hub.to_owned());
                self.hubs.entry(key).or_default()
            }
        }
    }

    /// Every accepted policy, with its scope: the namespace's (saved, then unsaved), then each
    /// hub's.
    fn all(&self) -> impl Iterator<Item = (Scope, &AccessPolicy)> {
        let namespace = self.policies.iter().chain(&self.unsaved);
        namespace.map(|p| (Scope::Namespace, p)).chain(
            self.hubs
                .iter()
                .flat_map(|(hub, ps)| ps.iter().map(|p| (Scope::Hub(hub.clone()), p))),
        )
    }

    fn not_found(&self, scope: &Scope, name: &str) -> AmqpError {
        AmqpError::PolicyNotFound {
            scope: scope.to_string(),
            name: name.to_owned(),
            known: self.scope(scope).iter().map(|p| p.name.clone()).collect(),
        }
    }

    fn position(&self, scope: &Scope, name: &str) -> Result<usize, AmqpError> {
        self.scope(scope)
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| self.not_found(scope, name))
    }
}

/// The shared state behind every clone of an [`AccessPolicies`].
struct Shared {
    /// The set every door checks against; replaced whole on a change.
    current: RwLock<Arc<PolicySet>>,
    /// Held through a change (read, change, save, swap), so changes never interleave.
    changing: Mutex<()>,
    /// Where the set is saved after each change; `None`: kept in memory only.
    data_dir: Option<PathBuf>,
}

/// The namespace's and the event hubs' shared access policies: a handle whose clones share one
/// live set (see the module docs).
#[derive(Clone)]
pub struct AccessPolicies {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AccessPolicies {
    // Names and counts only: never a key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.snapshot();
        let names = |ps: &[AccessPolicy]| ps.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let hubs: BTreeMap<&String, Vec<String>> =
            set.hubs.iter().map(|(h, ps)| (h, names(ps))).collect();
        f.debug_struct("AccessPolicies")
            .field("namespace", &names(&set.policies))
            .field("unsaved", &set.unsaved.len())
            .field("hubs", &hubs)
            .finish()
    }
}

impl PartialEq for AccessPolicies {
    /// Whether both hold the same policies now.
    fn eq(&self, other: &Self) -> bool {
        *self.snapshot() == *other.snapshot()
    }
}

impl Eq for AccessPolicies {}

impl AccessPolicies {
    /// Namespace policies from a list, kept in memory only; names must be unique
    /// (case-sensitive, as in Event Hubs) and each policy needs a name, a key and at least one
    /// right.
    pub fn new(policies: Vec<AccessPolicy>) -> Result<Self, AmqpError> {
        let set = PolicySet {
            policies,
            ..PolicySet::default()
        };
        set.check()?;
        Ok(Self::holding(set, None))
    }

    fn holding(set: PolicySet, data_dir: Option<PathBuf>) -> Self {
        AccessPolicies {
            shared: Arc::new(Shared {
                current: RwLock::new(Arc::new(set)),
                changing: Mutex::new(()),
                data_dir,
            }),
        }
    }

    /// The set as it is now.
    fn snapshot(&self) -> Arc<PolicySet> {
        self.shared.current.read().expect("policies").clone()
    }

    /// These policies, also accepting the namespace policy `policy` for as long as this set
    /// lives: it is never saved and not among [`Self::policies`], and may share a saved
    /// policy's name (see the module docs). What `serve --emulator-compat` does with the
    /// emulator's well-known key. Every clone of this handle accepts it too.
    pub fn accepting_unsaved(self, policy: AccessPolicy) -> Self {
        assert!(!policy.name.is_empty(), "an unsaved policy has a name");
        assert!(!policy.key.is_empty(), "an unsaved policy has a key");
        assert!(!policy.rights.is_empty(), "an unsaved policy has rights");
        {
            let _changing = self.shared.changing.lock().expect("policy changes");
            let mut current = self.shared.current.write().expect("policies");
            Arc::make_mut(&mut current).unsaved.push(policy);
        }
        self
    }

    /// The policy named `name` (in any scope) one of whose keys is `key` (a SASL PLAIN login,
    /// or a connection string given as a password), if any. Every key of that name is tried.
    /// `subtle` compares in time that depends only on the lengths (a key's length is not
    /// secret: every generated key is 44 base64 characters), never on where the bytes differ.
    pub fn verify_key(&self, name: &str, key: &[u8]) -> Option<Signer> {
        use subtle::ConstantTimeEq as _;
        let set = self.snapshot();
        set.all()
            .filter(|(_, p)| p.name == name)
            .find(|(_, p)| p.keys().any(|k| bool::from(k.as_bytes().ct_eq(key))))
            .map(|(scope, policy)| Signer::of(policy, &scope))
    }

    /// Verifies a SAS token at `now_secs` (unix seconds) against every key of the policies of
    /// its key name that may sign for its audience (the namespace's, and those of the event hub
    /// it names); returns what it says and the policy whose key signed it.
    pub fn verify_token(
        &self,
        token: &str,
        now_secs: i64,
    ) -> Result<(sas::Verified, Signer), TokenRefused> {
        let parsed = sas::parse(token)?;
        let path = tributary_eventhubs::address::strip_host(&parsed.audience);
        let audience_hub = path.split('/').next().unwrap_or_default();
        let set = self.snapshot();
        let mut refusal = TokenRefused::Sas(sas::SasError::UnknownKeyName(parsed.key_name.clone()));
        for (scope, policy) in set.all().filter(|(_, p)| p.name == parsed.key_name) {
            if let Scope::Hub(hub) = &scope
                && !hub.eq_ignore_ascii_case(audience_hub)
            {
                if matches!(refusal, TokenRefused::Sas(sas::SasError::UnknownKeyName(_))) {
                    refusal = TokenRefused::OutsideHub {
                        key_name: parsed.key_name.clone(),
                        hub: hub.clone(),
                        audience: parsed.audience.clone(),
                    };
                }
                continue;
            }
            for key in policy.keys() {
                match sas::verify(token, |_| Some(key), now_secs) {
                    Ok(verified) => return Ok((verified, Signer::of(policy, &scope))),
                    // Signed with this key but expired: that is the answer.
                    Err(e @ sas::SasError::Expired { .. }) => return Err(e.into()),
                    Err(_) => {
                        refusal = TokenRefused::WrongKey {
                            key_name: parsed.key_name.clone(),
                        }
                    }
                }
            }
        }
        Err(refusal)
    }

    /// Checks a token for the admin API (the Event Hubs REST scheme): valid now, signed by a
    /// policy with the Manage right, for the whole namespace (`sr=sb://<host>/`). The error says
    /// why not in words a person can act on, never with the token or a key.
    pub fn verify_admin_token(&self, token: &str, now_secs: i64) -> Result<Signer, String> {
        let (verified, signer) = self
            .verify_token(token, now_secs)
            .map_err(|e| format!("the SAS token was refused: {e}"))?;
        if !signer.allows(Right::Manage) {
            return Err(format!(
                "the shared access policy {:?} does not have the Manage right, which the admin API needs",
                signer.name
            ));
        }
        if !tributary_eventhubs::address::strip_host(&verified.audience).is_empty() {
            return Err(format!(
                "the SAS token is for {:?}; the admin API needs one for the whole namespace (sr=sb://<host>/)",
                verified.audience
            ));
        }
        Ok(signer)
    }

    /// Loads `<data_dir>/access-policies.json`, or creates it with a new
    /// `RootManageSharedAccessKey` policy; changes made through the result are saved there.
    /// When it was created, also returns that policy's connection string (for `localhost` on
    /// port 5672; see [`connection_string`] for another endpoint), so a first start can show it
    /// once.
    pub fn load_or_create(data_dir: &Path) -> Result<(Self, Option<String>), AmqpError> {
        let path = data_dir.join(POLICIES_FILE);
        match std::fs::File::open(&path) {
            Ok(file) => {
                let bytes = read_private(file, &path)?;
                let set = parse(&path, &bytes)?;
                Ok((Self::holding(set, Some(data_dir.to_owned())), None))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let root = AccessPolicy::generate(ROOT_POLICY, vec![Right::Manage])?;
                let shown = connection_string("localhost", DEFAULT_PORT, &root);
                let set = PolicySet {
                    policies: vec![root],
                    ..PolicySet::default()
                };
                write_file(data_dir, &set)?;
                Ok((Self::holding(set, Some(data_dir.to_owned())), Some(shown)))
            }
            Err(source) => Err(AmqpError::PoliciesIo {
                op: "read",
                path,
                source,
            }),
        }
    }

    /// Writes the saved policies to `<data_dir>/access-policies.json` atomically.
    pub fn save(&self, data_dir: &Path) -> Result<(), AmqpError> {
        write_file(data_dir, &self.snapshot())
    }

    /// The namespace's saved policies, in file order.
    pub fn policies(&self) -> Vec<AccessPolicy> {
        self.snapshot().policies.clone()
    }

    /// The namespace's saved policy named `name`, if any (names are case-sensitive).
    pub fn get(&self, name: &str) -> Option<AccessPolicy> {
        self.snapshot()
            .policies
            .iter()
            .find(|p| p.name == name)
            .cloned()
    }

    /// The saved policies of `scope`, in file order.
    pub fn list(&self, scope: &Scope) -> Vec<AccessPolicy> {
        self.snapshot().scope(scope).to_vec()
    }

    /// The policy `name` of `scope`; the error names the policies there are.
    pub fn find(&self, scope: &Scope, name: &str) -> Result<AccessPolicy, AmqpError> {
        let set = self.snapshot();
        let index = set.position(scope, name)?;
        Ok(set.scope(scope)[index].clone())
    }

    /// Applies `change` to a copy of the set, checks and saves the result, and makes it the set
    /// every door checks against. Nothing changes when any step fails.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut PolicySet) -> Result<T, AmqpError>,
    ) -> Result<T, AmqpError> {
        let _changing = self.shared.changing.lock().expect("policy changes");
        let mut next = (*self.snapshot()).clone();
        let answer = change(&mut next)?;
        next.check()?;
        if let Some(data_dir) = &self.shared.data_dir {
            write_file(data_dir, &next)?;
        }
        *self.shared.current.write().expect("policies") = Arc::new(next);
        Ok(answer)
    }

    /// Creates the policy `name` with `rights` and fresh keys in `scope` (the caller checks
    /// that a hub exists and passes its name as the hub spells it).
    pub fn create(
        &self,
        scope: &Scope,
        name: &str,
        rights: Vec<Right>,
    ) -> Result<AccessPolicy, AmqpError> {
        let policy = AccessPolicy::generate(name, rights)?;
        self.change(|set| {
            if set.scope(scope).iter().any(|p| p.name == name) {
                return Err(AmqpError::PolicyExists {
                    scope: scope.to_string(),
                    name: name.to_owned(),
                });
            }
            set.scope_mut(scope).push(policy.clone());
            Ok(policy)
        })
    }

    /// Regenerates the key `which` of the policy `name` of `scope`; from now on the old key
    /// signs nothing. Returns the policy with its new key.
    pub fn rotate(
        &self,
        scope: &Scope,
        name: &str,
        which: KeyType,
    ) -> Result<AccessPolicy, AmqpError> {
        let key = random_key()?;
        self.change(|set| {
            let index = set.position(scope, name)?;
            let policy = &mut set.scope_mut(scope)[index];
            match which {
                KeyType::Primary => policy.key = key,
                KeyType::Secondary => policy.secondary_key = Some(key),
            }
            Ok(policy.clone())
        })
    }

    /// Deletes the policy `name` of `scope`.
    pub fn delete(&self, scope: &Scope, name: &str) -> Result<(), AmqpError> {
        self.change(|set| {
            let index = set.position(scope, name)?;
            set.scope_mut(scope).remove(index);
            set.hubs.retain(|_, ps| !ps.is_empty());
            Ok(())
        })
    }

    /// Deletes every policy of the event hub `hub` (deleted with the hub, so a hub created
    /// later under its name starts with none); how many there were.
    pub fn delete_hub(&self, hub: &str) -> Result<usize, AmqpError> {
        if self.snapshot().hub_key(hub).is_none() {
            return Ok(0);
        }
        self.change(|set| {
            let key = set.hub_key(hub).cloned();
            Ok(key
                .and_then(|k| set.hubs.remove(&k))
                .map_or(0, |ps| ps.len()))
        })
    }

    /// Deletes the policies of every event hub not in `hubs` (left by a hub deleted while the
    /// policies could not follow); the hubs whose policies went.
    pub fn retain_hubs(&self, hubs: &[String]) -> Result<Vec<String>, AmqpError> {
        let exists = |h: &String| hubs.iter().any(|n| n.eq_ignore_ascii_case(h));
        if self.snapshot().hubs.keys().all(exists) {
            return Ok(Vec::new());
        }
        self.change(|set| {
            let gone: Vec<String> = set.hubs.keys().filter(|h| !exists(h)).cloned().collect();
            set.hubs.retain(|h, _| exists(h));
            Ok(gone)
        })
    }

    /// Gives a fresh secondary key to every saved policy without one (a file written before
    /// policies had two keys); how many got one.
    pub fn complete_keys(&self) -> Result<usize, AmqpError> {
        let missing = |set: &PolicySet| {
            let hubs = set.hubs.values().flatten();
            set.policies
                .iter()
                .chain(hubs)
                .filter(|p| p.secondary_key.is_none())
                .count()
        };
        if missing(&self.snapshot()) == 0 {
            return Ok(0);
        }
        self.change(|set| {
            let count = missing(set);
            let hubs = set.hubs.values_mut().flatten();
            for policy in set.policies.iter_mut().chain(hubs) {
                if policy.secondary_key.is_none() {
                    policy.secondary_key = Some(random_key()?);
                }
            }
            Ok(count)
        })
    }
}

/// The policies file's format (see [`tributary_event::format`]): 1 since the file was written
/// (a file without a `version` is format 1).
const POLICIES_VERSION: u32 = 1;

/// What the file holds: the saved policy set and its format version.
#[derive(Serialize)]
struct PoliciesFile<'a> {
    version: u32,
    #[serde(flatten)]
    set: &'a PolicySet,
}

fn parse(path: &Path, bytes: &[u8]) -> Result<PolicySet, AmqpError> {
    let invalid = |reason: String| AmqpError::PoliciesInvalid {
        path: path.to_owned(),
        reason,
    };
    let found = tributary_broker::json_format_version(bytes).unwrap_or(1);
    check_format_version("the file", found, POLICIES_VERSION.into())
        .map_err(|too_new| invalid(too_new.to_string()))?;
    let set: PolicySet = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    set.check().map_err(|e| invalid(e.to_string()))?;
    Ok(set)
}

/// Writes the saved policies of `set` to `<data_dir>/access-policies.json` atomically.
fn write_file(data_dir: &Path, set: &PolicySet) -> Result<(), AmqpError> {
    let path = data_dir.join(POLICIES_FILE);
    let tmp = data_dir.join(format!("{POLICIES_FILE}.tmp"));
    let io = |op, path: &PathBuf| {
        let path = path.clone();
        move |source| AmqpError::PoliciesIo { op, path, source }
    };
    let file = PoliciesFile {
        version: POLICIES_VERSION,
        set,
    };
    let mut json = serde_json::to_vec_pretty(&file).expect("policies serialize to JSON");
    json.push(b'\n');
    std::fs::create_dir_all(data_dir).map_err(io("create", &data_dir.to_owned()))?;
    let mut out = open_private(&tmp).map_err(io("create", &tmp))?;
    out.write_all(&json).map_err(io("write", &tmp))?;
    out.sync_all().map_err(io("sync", &tmp))?;
    drop(out);
    std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
    let dir = std::fs::File::open(data_dir).map_err(io("open", &data_dir.to_owned()))?;
    dir.sync_all().map_err(io("sync", &data_dir.to_owned()))?;
    Ok(())
}

/// Reads a file that holds keys, refusing it when group or others may read it.
fn read_private(mut file: std::fs::File, path: &Path) -> Result<Vec<u8>, AmqpError> {
    let io = |op| {
        move |source| AmqpError::PoliciesIo {
            op,
            path: path.to_owned(),
            source,
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // The open file's own mode: what is checked is what is read.
        let mode = file.metadata().map_err(io("stat"))?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(AmqpError::PoliciesExposed {
                path: path.to_owned(),
                mode,
            });
        }
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io("read"))?;
    Ok(bytes)
}

fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// The connection string the official SDKs take for `policy` on `host:port`, with
/// `UseDevelopmentEmulator=true` so they speak plain TCP (no TLS).
pub fn connection_string(host: &str, port: u16, policy: &AccessPolicy) -> String {
    tributary_eventhubs::connection_string::emulator_connection_string(
        host,
        port,
        &policy.name,
        &policy.key,
    )
}

/// The connection string for `policy` on an AMQPS listener at `host:port` (no emulator mode:
/// the SDKs speak TLS).
pub fn tls_connection_string(host: &str, port: u16, policy: &AccessPolicy) -> String {
    tributary_eventhubs::connection_string::tls_connection_string(
        host,
        port,
        &policy.name,
        &policy.key,
    )
}

/// The connection string for `policy` of `scope` with its key `which` on `host:port`: for an
/// AMQPS listener when `tls`, else in the SDKs' emulator mode (plain TCP); a hub's policy's
/// carries `EntityPath=<hub>`, as the portal gives it. `None` when the policy has no such key.
pub fn policy_connection_string(
    host: &str,
    port: u16,
    tls: bool,
    policy: &AccessPolicy,
    scope: &Scope,
    which: KeyType,
) -> Option<String> {
    use tributary_eventhubs::connection_string as cs;
    let key = policy.key_of(which)?;
    let base = if tls {
        cs::tls_connection_string(host, port, &policy.name, key)
    } else {
        cs::emulator_connection_string(host, port, &policy.name, key)
    };
    Some(match scope.hub() {
        Some(hub) => format!("{base};EntityPath={hub}"),
        None => base,
    })
}

/// Policies for unit tests: `root` (Manage, key `c2VjcmV0LWtleQ==`, base64 of `secret-key`
/// as the Azure samples use) and `listener` (Listen, key `listen-key`).
#[cfg(test)]
pub(crate) fn test_policies() -> AccessPolicies {
    AccessPolicies::new(vec![
        AccessPolicy {
            name: "root".into(),
            key: "c2VjcmV0LWtleQ==".into(),
            secondary_key: None,
            rights: vec![Right::Manage],
        },
        AccessPolicy {
            name: "listener".into(),
            key: "listen-key".into(),
            secondary_key: None,
            rights: vec![Right::Listen],
        },
    ])
    .expect("the test policies are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_creates_a_root_policy_and_shows_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let (policies, shown) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let root = policies.get(ROOT_POLICY).unwrap();
        assert!(root.allows(Right::Send) && root.allows(Right::Listen));
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&root.key)
            .unwrap();
        assert_eq!(decoded.len(), 32);
        let shown = shown.unwrap();
        assert!(shown.contains(&root.key), "{shown}");
        assert!(shown.starts_with(
            "Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
        ));
        let (again, shown_again) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert_eq!(again, policies);
        assert_eq!(shown_again, None);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(POLICIES_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    #[cfg(unix)]
    fn a_policies_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        AccessPolicies::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(POLICIES_FILE);
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = AccessPolicies::load_or_create(dir.path())
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(&path.display().to_string())
                    && error.contains("readable by group or others")
                    && error.contains(&format!("chmod 600 {}", path.display())),
                "{error}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (policies, created) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert!(created.is_none());
        assert_eq!(policies.policies()[0].name, ROOT_POLICY);
    }

    #[test]
    fn invalid_policies_are_refused() {
        let p = |name: &str, key: &str, rights: Vec<Right>| AccessPolicy {
            name: name.into(),
            key: key.into(),
            secondary_key: None,
            rights,
        };
        assert!(AccessPolicies::new(vec![p("", "k", vec![Right::Send])]).is_err());
        assert!(AccessPolicies::new(vec![p("a", "", vec![Right::Send])]).is_err());
        assert!(AccessPolicies::new(vec![p("a", "k", vec![])]).is_err());
        assert!(
            AccessPolicies::new(vec![
                p("a", "k", vec![Right::Send]),
                p("a", "j", vec![Right::Listen])
            ])
            .is_err()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut file = open_private(&dir.path().join(POLICIES_FILE)).unwrap();
        file.write_all(b"{\"policies\": 3}").unwrap();
        assert!(matches!(
            AccessPolicies::load_or_create(dir.path()),
            Err(AmqpError::PoliciesInvalid { .. })
        ));
    }

    #[test]
    fn the_emulator_key_is_accepted_only_when_added_and_never_saved() {
        let dir = tempfile::tempdir().unwrap();
        let (saved, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let now: i64 = 1_000;
        let token = sas::sign("sb://localhost/", EMULATOR_KEY_NAME, EMULATOR_KEY, 1_060);
        assert!(matches!(
            saved.verify_token(&token, now),
            Err(TokenRefused::WrongKey { .. })
        ));
        let (compat, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let compat = compat.accepting_unsaved(AccessPolicy::emulator_well_known());
        let (verified, signer) = compat.verify_token(&token, now).unwrap();
        assert_eq!(verified.key_name, EMULATOR_KEY_NAME);
        assert!(signer.allows(Right::Manage));
        // The saved root policy of the same name still signs, with its own key.
        let root = saved.get(ROOT_POLICY).unwrap();
        let own = sas::sign("sb://localhost/", ROOT_POLICY, &root.key, 1_060);
        assert!(compat.verify_token(&own, now).is_ok());
        // Expired is told as expired, whichever key signed it.
        assert!(matches!(
            compat.verify_token(&token, now + 61),
            Err(TokenRefused::Sas(sas::SasError::Expired { .. }))
        ));
        assert_eq!(compat.policies(), saved.policies());
        compat.save(dir.path()).unwrap();
        let file = std::fs::read_to_string(dir.path().join(POLICIES_FILE)).unwrap();
        assert!(!file.contains(EMULATOR_KEY), "{file}");
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert!(reloaded.verify_token(&token, now).is_err());
    }

    #[test]
    fn either_key_signs_and_a_rotated_key_signs_nothing_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (policies, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let door = policies.clone();
        let root = policies.get(ROOT_POLICY).unwrap();
        let secondary = root.secondary_key.clone().expect("a secondary key");
        assert_ne!(secondary, root.key);
        let now = 1_000;
        let by = |key: &str| sas::sign("sb://localhost/hub", ROOT_POLICY, key, 2_000);
        assert!(door.verify_token(&by(&root.key), now).is_ok());
        assert!(door.verify_token(&by(&secondary), now).is_ok());
        assert!(door.verify_key(ROOT_POLICY, secondary.as_bytes()).is_some());
        let rotated = policies
            .rotate(&Scope::Namespace, ROOT_POLICY, KeyType::Primary)
            .unwrap();
        assert_ne!(rotated.key, root.key);
        assert_eq!(rotated.secondary_key.as_deref(), Some(secondary.as_str()));
        // The door's clone sees it at once.
        let refused = door.verify_token(&by(&root.key), now).unwrap_err();
        assert!(
            matches!(refused, TokenRefused::WrongKey { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("regenerated"), "{refused}");
        assert!(door.verify_key(ROOT_POLICY, root.key.as_bytes()).is_none());
        assert!(door.verify_token(&by(&rotated.key), now).is_ok());
        assert!(door.verify_token(&by(&secondary), now).is_ok());
        // And it was saved.
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert_eq!(reloaded.get(ROOT_POLICY).unwrap().key, rotated.key);
        let rotated = policies
            .rotate(&Scope::Namespace, ROOT_POLICY, KeyType::Secondary)
            .unwrap();
        assert!(door.verify_token(&by(&secondary), now).is_err());
        assert!(
            door.verify_token(&by(rotated.secondary_key.as_deref().unwrap()), now)
                .is_ok()
        );
    }

    #[test]
    fn a_hubs_policy_signs_for_its_hub_only() {
        let dir = tempfile::tempdir().unwrap();
        let (policies, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let orders = Scope::Hub("Orders".into());
        let send = policies.create(&orders, "send", vec![Right::Send]).unwrap();
        let now = 1_000;
        let token = |audience: &str| sas::sign(audience, "send", &send.key, 2_000);
        let (_, signer) = policies.verify_token(&token("sb://h/orders"), now).unwrap();
        assert_eq!(signer.scope, orders);
        assert!(
            policies
                .verify_token(&token("sb://h/orders/partitions/0"), now)
                .is_ok()
        );
        for elsewhere in ["sb://h/", "sb://h/payments", "sb://h/orders2"] {
            let refused = policies.verify_token(&token(elsewhere), now).unwrap_err();
            assert!(
                matches!(refused, TokenRefused::OutsideHub { .. }),
                "{refused}"
            );
            assert!(refused.to_string().contains("\"Orders\""), "{refused}");
        }
        let login = policies.verify_key("send", send.key.as_bytes()).unwrap();
        assert_eq!(login.scope, orders);
        // The same name on the namespace and on another hub: each key proves its own.
        let namespace = policies
            .create(&Scope::Namespace, "send", vec![Right::Listen])
            .unwrap();
        let other = policies
            .create(&Scope::Hub("payments".into()), "send", vec![Right::Send])
            .unwrap();
        let by_namespace = sas::sign("sb://h/orders", "send", &namespace.key, 2_000);
        assert_eq!(
            policies.verify_token(&by_namespace, now).unwrap().1.scope,
            Scope::Namespace
        );
        let wrong_hub = sas::sign("sb://h/orders", "send", &other.key, 2_000);
        assert!(policies.verify_token(&wrong_hub, now).is_err());
        // Names are unique per scope; hubs compare case-insensitively.
        let again = policies.create(&Scope::Hub("ORDERS".into()), "send", vec![Right::Send]);
        assert!(matches!(again, Err(AmqpError::PolicyExists { .. })));
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert_eq!(
            reloaded.list(&Scope::Hub("orders".into())),
            vec![send.clone()]
        );
        assert_eq!(policies.delete_hub("orders").unwrap(), 1);
        assert!(policies.verify_token(&token("sb://h/orders"), now).is_err());
        assert_eq!(
            policies.retain_hubs(&[]).unwrap(),
            vec!["payments".to_owned()]
        );
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert_eq!(reloaded.list(&Scope::Hub("payments".into())), Vec::new());
        policies.delete(&Scope::Namespace, "send").unwrap();
        let missing = policies
            .delete(&Scope::Namespace, "send")
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("there are: RootManageSharedAccessKey"),
            "{missing}"
        );
    }

    #[test]
    fn a_file_without_secondary_keys_loads_and_is_completed() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = open_private(&dir.path().join(POLICIES_FILE)).unwrap();
        file.write_all(br#"{"policies": [{"name": "a", "key": "k", "rights": ["Send"]}]}"#)
            .unwrap();
        let (policies, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert_eq!(policies.get("a").unwrap().secondary_key, None);
        assert_eq!(policies.complete_keys().unwrap(), 1);
        assert_eq!(policies.complete_keys().unwrap(), 0);
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        let a = reloaded.get("a").unwrap();
        assert_eq!(a.key, "k");
        assert!(a.secondary_key.is_some());
    }

    #[test]
    fn debug_output_never_shows_the_key() {
        let policy = AccessPolicy::generate("p", vec![Right::Listen]).unwrap();
        assert!(!format!("{policy:?}").contains(&policy.key));
        let secondary = policy.secondary_key.clone().unwrap();
        assert!(!format!("{policy:?}").contains(&secondary));
        assert!(
            !format!("{:?}", AccessPolicies::new(vec![policy.clone()]).unwrap())
                .contains(&policy.key)
        );
    }
}

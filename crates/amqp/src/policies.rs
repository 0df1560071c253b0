//! Shared access policies: named keys with rights, as an Event Hubs namespace has them.
//!
//! A policy has a name (the `SharedAccessKeyName` of a connection string), a key (the
//! `SharedAccessKey`, used as-is — its UTF-8 bytes — to sign SAS tokens, exactly as the SDKs do)
//! and rights: [`Right::Listen`] to receive, [`Right::Send`] to send, [`Right::Manage`] for
//! everything.
//!
//! # Persistence
//! The policies live in `<data_dir>/access-policies.json`, written atomically (a temporary file,
//! `fsync`, rename, `fsync` of the directory) with mode 0600 because it holds keys.
//! [`AccessPolicies::load_or_create`] creates the file on first start with a
//! `RootManageSharedAccessKey` policy holding a random 32-byte key and returns its connection
//! string once, so the operator can copy it. A policies file readable by group or others is
//! refused with an error naming it and the `chmod 600` that fixes it (the rule and wording of
//! the editor's key files, `tributary-edit`'s `steps::keys`, which this crate cannot depend on).
//!
//! # Keys accepted for one run only
//! [`AccessPolicies::accepting_unsaved`] adds a policy that is accepted but never saved: `serve
//! --emulator-compat` adds Microsoft's Event Hubs emulator's publicly known key
//! ([`AccessPolicy::emulator_well_known`]) that way, so it is accepted only while that flag is
//! given, and never lands in the file. Such a policy may share its name with a saved one (the
//! emulator's key name is `RootManageSharedAccessKey`, as is the root policy's): a token or a
//! PLAIN login is accepted when any key of that name proves it, as an Event Hubs policy takes
//! either of its two keys, and gets the rights of the policy whose key proved it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};

use tributary_eventhubs::sas;

use crate::AmqpError;

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

/// One shared access policy.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessPolicy {
    /// Its name (`SharedAccessKeyName`).
    pub name: String,
    /// Its key (`SharedAccessKey`): the text whose UTF-8 bytes sign tokens.
    pub key: String,
    /// What it allows.
    pub rights: Vec<Right>,
}

impl std::fmt::Debug for AccessPolicy {
    // Never print a key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessPolicy")
            .field("name", &self.name)
            .field("key", &"<redacted>")
            .field("rights", &self.rights)
            .finish()
    }
}

impl AccessPolicy {
    /// A policy with a fresh random 32-byte key (base64), as the portal makes them.
    pub fn generate(name: impl Into<String>, rights: Vec<Right>) -> Result<Self, AmqpError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| AmqpError::Random(e.to_string()))?;
        Ok(AccessPolicy {
            name: name.into(),
            key: base64::engine::general_purpose::STANDARD.encode(raw),
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
            rights: vec![Right::Manage],
        }
    }

    /// Whether the policy grants `right` (Manage grants everything).
    pub fn allows(&self, right: Right) -> bool {
        self.rights.contains(&right) || self.rights.contains(&Right::Manage)
    }
}

#[derive(Serialize, Deserialize)]
struct PoliciesFile {
    policies: Vec<AccessPolicy>,
}

/// The namespace's shared access policies. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicies {
    /// The policies of the file (or of [`AccessPolicies::new`]): what [`Self::save`] writes.
    policies: Vec<AccessPolicy>,
    /// Policies accepted for this process only; never saved, never listed by [`Self::policies`].
    unsaved: Vec<AccessPolicy>,
}

impl AccessPolicies {
    /// Policies from a list; names must be unique (case-sensitive, as in Event Hubs) and each
    /// policy needs a name, a key and at least one right.
    pub fn new(policies: Vec<AccessPolicy>) -> Result<Self, AmqpError> {
        for (index, policy) in policies.iter().enumerate() {
            if policy.name.is_empty() || policy.name.len() > 256 {
                return Err(AmqpError::InvalidPolicy(format!(
                    "policy {index}: the name must have 1 to 256 characters"
                )));
            }
            if policy.name.contains([';', '=']) {
                return Err(AmqpError::InvalidPolicy(format!(
                    "policy {:?}: the name may not contain ';' or '='",
                    policy.name
                )));
            }
            if policy.key.is_empty() {
                return Err(AmqpError::InvalidPolicy(format!(
                    "policy {:?} has an empty key",
                    policy.name
                )));
            }
            if policy.rights.is_empty() {
                return Err(AmqpError::InvalidPolicy(format!(
                    "policy {:?} has no rights",
                    policy.name
                )));
            }
            if policies[..index].iter().any(|p| p.name == policy.name) {
                return Err(AmqpError::InvalidPolicy(format!(
                    "policy {:?} is defined twice",
                    policy.name
                )));
            }
        }
        Ok(AccessPolicies {
            policies,
            unsaved: Vec::new(),
        })
    }

    /// These policies, also accepting `policy` for as long as this value lives: it is never
    /// saved and not among [`Self::policies`], and may share a saved policy's name (see the
    /// module docs). What `serve --emulator-compat` does with the emulator's well-known key.
    pub fn accepting_unsaved(mut self, policy: AccessPolicy) -> Self {
        assert!(!policy.name.is_empty(), "an unsaved policy has a name");
        assert!(!policy.key.is_empty(), "an unsaved policy has a key");
        assert!(!policy.rights.is_empty(), "an unsaved policy has rights");
        self.unsaved.push(policy);
        self
    }

    /// Every accepted policy named `name` (case-sensitive): the saved one, if any, first.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a AccessPolicy> + 'a {
        self.policies
            .iter()
            .chain(&self.unsaved)
            .filter(move |p| p.name == name)
    }

    /// The accepted policy named `name` whose key is `key` (a SASL PLAIN login, or a connection
    /// string given as a password), if any. Every key of that name is tried (`serve
    /// --emulator-compat` adds one beside the saved). `subtle` compares in time that depends
    /// only on the lengths (a key's length is not secret: every generated key is 44 base64
    /// characters), never on where the bytes differ.
    pub fn verify_key(&self, name: &str, key: &[u8]) -> Option<&AccessPolicy> {
        use subtle::ConstantTimeEq as _;
        self.policies
            .iter()
            .chain(&self.unsaved)
            .filter(|p| p.name == name)
            .find(|policy| bool::from(policy.key.as_bytes().ct_eq(key)))
    }

    /// Verifies a SAS token against every accepted key of its key name at `now_secs` (unix
    /// seconds); returns what it says and the policy whose key signed it.
    pub fn verify_token(
        &self,
        token: &str,
        now_secs: i64,
    ) -> Result<(sas::Verified, &AccessPolicy), sas::SasError> {
        let key_name = sas::parse(token)?.key_name;
        let mut refusal = sas::SasError::UnknownKeyName(key_name.clone());
        let named = self.policies.iter().chain(&self.unsaved);
        for policy in named.filter(|p| p.name == key_name) {
            match sas::verify(token, |_| Some(policy.key.as_str()), now_secs) {
                Ok(verified) => return Ok((verified, policy)),
                // Signed with this key but expired: that is the answer.
                Err(e @ sas::SasError::Expired { .. }) => return Err(e),
                Err(e) => refusal = e,
            }
        }
        Err(refusal)
    }

    /// Loads `<data_dir>/access-policies.json`, or creates it with a new
    /// `RootManageSharedAccessKey` policy. When it was created, also returns that policy's
    /// connection string (for `localhost` on port 5672; see [`connection_string`] for another
    /// endpoint), so a first start can show it once.
    pub fn load_or_create(data_dir: &Path) -> Result<(Self, Option<String>), AmqpError> {
        let path = data_dir.join(POLICIES_FILE);
        match std::fs::File::open(&path) {
            Ok(file) => {
                let bytes = read_private(file, &path)?;
                Ok((Self::parse(&path, &bytes)?, None))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let root = AccessPolicy::generate(ROOT_POLICY, vec![Right::Manage])?;
                let shown = connection_string("localhost", DEFAULT_PORT, &root);
                let policies = AccessPolicies::new(vec![root])?;
                policies.save(data_dir)?;
                Ok((policies, Some(shown)))
            }
            Err(source) => Err(AmqpError::PoliciesIo {
                op: "read",
                path,
                source,
            }),
        }
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, AmqpError> {
        let invalid = |reason: String| AmqpError::PoliciesInvalid {
            path: path.to_owned(),
            reason,
        };
        let file: PoliciesFile =
            serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        AccessPolicies::new(file.policies).map_err(|e| invalid(e.to_string()))
    }

    /// Writes the policies to `<data_dir>/access-policies.json` atomically.
    pub fn save(&self, data_dir: &Path) -> Result<(), AmqpError> {
        let path = data_dir.join(POLICIES_FILE);
        let tmp = data_dir.join(format!("{POLICIES_FILE}.tmp"));
        let io = |op, path: &PathBuf| {
            let path = path.clone();
            move |source| AmqpError::PoliciesIo { op, path, source }
        };
        let file = PoliciesFile {
            policies: self.policies.clone(),
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

    /// Every policy, in file order.
    pub fn policies(&self) -> &[AccessPolicy] {
        &self.policies
    }

    /// The saved policy named `name`, if any (names are case-sensitive).
    pub fn get(&self, name: &str) -> Option<&AccessPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }
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

/// Policies for unit tests: `root` (Manage, key `c2VjcmV0LWtleQ==`, base64 of `secret-key`
/// as the Azure samples use) and `listener` (Listen, key `listen-key`).
#[cfg(test)]
pub(crate) fn test_policies() -> AccessPolicies {
    AccessPolicies::new(vec![
        AccessPolicy {
            name: "root".into(),
            key: "c2VjcmV0LWtleQ==".into(),
            rights: vec![Right::Manage],
        },
        AccessPolicy {
            name: "listener".into(),
            key: "listen-key".into(),
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
            Err(sas::SasError::BadSignature(_))
        ));
        let compat = saved
            .clone()
            .accepting_unsaved(AccessPolicy::emulator_well_known());
        let (verified, policy) = compat.verify_token(&token, now).unwrap();
        assert_eq!(verified.key_name, EMULATOR_KEY_NAME);
        assert_eq!(policy.key, EMULATOR_KEY);
        assert!(policy.allows(Right::Manage));
        // The saved root policy of the same name still signs, with its own key.
        let root = saved.get(ROOT_POLICY).unwrap();
        let own = sas::sign("sb://localhost/", ROOT_POLICY, &root.key, 1_060);
        assert_eq!(compat.verify_token(&own, now).unwrap().1.key, root.key);
        // Expired is told as expired, whichever key signed it.
        assert!(matches!(
            compat.verify_token(&token, now + 61),
            Err(sas::SasError::Expired { .. })
        ));
        assert_eq!(compat.policies(), saved.policies());
        compat.save(dir.path()).unwrap();
        let file = std::fs::read_to_string(dir.path().join(POLICIES_FILE)).unwrap();
        assert!(!file.contains(EMULATOR_KEY), "{file}");
        let (reloaded, _) = AccessPolicies::load_or_create(dir.path()).unwrap();
        assert!(reloaded.verify_token(&token, now).is_err());
    }

    #[test]
    fn debug_output_never_shows_the_key() {
        let policy = AccessPolicy::generate("p", vec![Right::Listen]).unwrap();
        assert!(!format!("{policy:?}").contains(&policy.key));
        assert!(
            !format!("{:?}", AccessPolicies::new(vec![policy.clone()]).unwrap())
                .contains(&policy.key)
        );
    }
}

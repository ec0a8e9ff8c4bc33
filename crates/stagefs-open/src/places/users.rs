//! Who this process runs as, and how users are named in messages.

/// The effective user's uid.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A user's name for messages ("uid 1002" when the password database does not know it).
pub fn user_label(uid: u32) -> String {
    match uzers::get_user_by_uid(uid) {
        Some(user) => format!("{} (uid {uid})", user.name().to_string_lossy()),
        None => format!("uid {uid}"),
    }
}

/// The user's name from the password database (`$USER` is unset in some SLURM steps).
pub fn user_name() -> String {
    let uid = my_uid();
    uzers::get_user_by_uid(uid)
        .map(|u| u.name().to_string_lossy().into_owned())
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| uid.to_string())
}

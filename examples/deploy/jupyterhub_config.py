# What a JupyterHub deployment adds for dpmagic: the gate as a Hub-managed
# service, known to kernels by its address, reachable with their Hub token.
# Merge into your jupyterhub_config.py; see README.md beside this file.
c = get_config()  # noqa: F821

GATE = "http://127.0.0.1:8765"

c.JupyterHub.services = [
    {
        "name": "dpmagic",
        "url": GATE,
        # Started and stopped by the Hub, as the Hub's Unix user; the policy,
        # data and state dir must be readable by that user only.
        "command": ["dpmagic", "serve", "--jupyterhub", "--policy", "/etc/dpmagic/policy.toml"],
    },
    # The owner's console (docs/console.md): a page for the Hub's admins only, in the
    # Hub's Services menu. It runs as the same Unix user as the gate.
    {
        "name": "dpmagic-console",
        "url": "http://127.0.0.1:8766",
        "command": ["dpmagic", "console", "--jupyterhub", "--policy", "/etc/dpmagic/policy.toml"],
        "oauth_no_confirm": True,
    },
]

# Users may reach the gate, and their servers' tokens (JUPYTERHUB_API_TOKEN,
# which every kernel inherits) carry that permission. Without it the gate
# answers "the token lacks the scope access:services!service=dpmagic".
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=dpmagic"]},
]
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service=dpmagic",
    # The user's Hub groups, which join the policy's [groups] for group budgets and
    # releases shared within groups; leave it out to use the policy's groups alone.
    "read:users:groups!user",
]

# Where kernels find the gate.
c.Spawner.environment = {"DPMAGIC_GATE": GATE}

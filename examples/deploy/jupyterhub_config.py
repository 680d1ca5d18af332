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
    }
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
]

# Where kernels find the gate.
c.Spawner.environment = {"DPMAGIC_GATE": GATE}

"""People: accounts and their roles, logins and sessions, and who may see which attempt."""

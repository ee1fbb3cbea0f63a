#!/usr/bin/env bash
# A real sshd on 127.0.0.1 for the "remote host over SSH" tests: key-only root login with a key
# made for the tests. The docker SDK's paramiko transport runs `docker system dial-stdio` on the
# far side, so the same dockerd becomes reachable as ssh://root@127.0.0.1:PORT. paramiko (used by
# the SDK and by infra/remote.py) reads ~/.ssh/config and ~/.ssh/known_hosts, so both are written
# here: an IdentityFile for this host and the server's host key.
set -euo pipefail
port=52222
dir=/tmp/baseline-sshd
if [ ! -x /usr/sbin/sshd ]; then
  bash "$(dirname "$0")/../apt-install.sh" openssh-server
fi
mkdir -p "$dir" /run/sshd ~/.ssh
chmod 700 "$dir" ~/.ssh
[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_ed25519"
[ -f "$dir/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C baseline-tests -f "$dir/id_ed25519"
# The test key's sessions get a HOME of their own, empty: every SSH connection runs its command
# through root's login shell, which sources ~/.bashrc (bash does so for sshd's commands), and a
# machine's root may start a whole toolchain there (pyenv init: a third of a second of bash
# processes per connection, on each of the suite's hundreds of docker-over-SSH connections). The
# working directory stays root's home; a real remote host's shell set-up is its own business.
mkdir -p "$dir/home"
echo "environment=\"HOME=$dir/home\" $(cat "$dir/id_ed25519.pub")" > "$dir/authorized_keys"
cat > "$dir/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 100
MaxStartups 100:30:200
PermitUserEnvironment HOME
CONF
/usr/sbin/sshd -t -f "$dir/sshd_config"
if ! { [ -f "$dir/sshd.pid" ] && kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null; }; then
  /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
fi
# Trust the host key (paramiko rejects unknown hosts) and name the test key for 127.0.0.1.
touch ~/.ssh/known_hosts
grep -v "^\[127.0.0.1\]:$port " ~/.ssh/known_hosts > "$dir/known_hosts.tmp" || true
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >> "$dir/known_hosts.tmp"
cat "$dir/known_hosts.tmp" > ~/.ssh/known_hosts
touch ~/.ssh/config
if ! grep -q "# baseline test sshd" ~/.ssh/config; then
  printf '\n# baseline test sshd\nHost 127.0.0.1\n    IdentityFile %s\n' "$dir/id_ed25519" >> ~/.ssh/config
fi
chmod 600 ~/.ssh/config ~/.ssh/known_hosts
for _ in $(seq 1 20); do
  ssh -o BatchMode=yes -p $port root@127.0.0.1 true 2>/dev/null && break
  sleep 0.5
done
ssh -o BatchMode=yes -p $port root@127.0.0.1 'docker version --format "docker over ssh: server {{.Server.Version}}"'
{
  echo "BASELINE_TEST_SSH_URL=ssh://root@127.0.0.1:$port"
  echo "BASELINE_TEST_SSH_KEY=$dir/id_ed25519"
} >> "${BASELINE_CI_ENV:-/dev/null}"

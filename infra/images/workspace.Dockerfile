# The CPU workspace image. BASE is a Debian bookworm root file system imported locally
# (infra/image_build.py: debootstrap + docker import), so no registry is needed; it already holds
# Python 3, pip, git, numpy and scikit-learn. Built by `baseline image build cpu`.
ARG BASE
FROM ${BASE}
# The host's CA bundle: egress goes through a TLS-inspecting proxy, so pip and git need it.
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null \
 && useradd --create-home --home-dir /home/participant --uid 1000 --user-group --shell /bin/bash participant \
 && mkdir -p /home/paper /home/submission /home/logs \
 && chown participant:participant /home/submission /home/logs \
 && git config --system init.defaultBranch main \
 && git config --system user.name participant \
 && git config --system user.email participant@workspace.invalid \
 && git config --system --add safe.directory /home/submission
# JupyterLab and the single-user server the hub's spawner starts inside this container (pinned;
# the hub on the host runs the same JupyterHub version). No pip cache: the image stays smaller.
RUN pip install --no-cache-dir --break-system-packages --root-user-action=ignore jupyterlab==4.6.6 jupyterhub==6.1.1 \
 && rm -rf /root/.cache
# `task`: the attempt's own commands (status, pause, score, submit, note), talking to the portal
# through Baseline's relay on the container's loopback (infra/images/task_cli.py).
COPY task /usr/local/bin/task
# Baseline's JupyterLab extension (infra/images/labextensions: prebuilt, written by hand): a hub
# restart shows no "restart your server?" dialog, the portal's work page says it reconnects.
COPY labextensions/ /usr/local/share/jupyter/labextensions/
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    HOME=/home/participant
USER participant
WORKDIR /home/submission
CMD ["sleep", "infinity"]

# The GPU workspace image (production): the same layout and user as workspace.Dockerfile, on the
# CUDA runtime base. Needs a registry that serves nvidia/cuda; built by `baseline image build h100`.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-pip python3-venv python3-numpy git ca-certificates curl procps \
 && rm -rf /var/lib/apt/lists/*
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null \
 && useradd --create-home --home-dir /home/participant --uid 1000 --user-group --shell /bin/bash participant \
 && mkdir -p /home/paper /home/submission /home/logs \
 && chown participant:participant /home/submission /home/logs \
 && git config --system init.defaultBranch main \
 && git config --system user.name participant \
 && git config --system user.email participant@workspace.invalid \
 && git config --system --add safe.directory /home/submission
# JupyterLab and the single-user server for the hub's spawner, pinned as in workspace.Dockerfile.
RUN pip install --no-cache-dir jupyterlab==4.6.6 jupyterhub==6.1.1
# `task`: the attempt's own commands (status, pause, score, submit, note), talking to the portal
# through Baseline's relay on the container's loopback (infra/images/task_cli.py).
COPY task /usr/local/bin/task
# Baseline's JupyterLab extension (infra/images/labextensions: prebuilt, written by hand): a hub
# restart shows no "restart your server?" dialog, the portal's work page says it reconnects.
COPY labextensions/ /usr/local/share/jupyter/labextensions/
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    HOME=/home/participant
USER participant
WORKDIR /home/submission
CMD ["sleep", "infinity"]

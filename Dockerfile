# gpuq operator image. Build it with `make image` (docker or podman): that first puts gpuq and its
# dependencies as wheels in build/wheelhouse (with the host's pip, so the host's index and CA
# settings apply and the image build itself needs no network), and, where the standard base image
# cannot be pulled, builds an equivalent Debian bookworm + Python 3.11 base from Debian packages
# (hack/debian-image.sh) and passes it in as BASE_IMAGE.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
COPY build/wheelhouse /wheels
RUN python3 -m venv /opt/gpuq \
 && /opt/gpuq/bin/pip install --quiet --no-cache-dir --no-index --find-links /wheels gpuq \
 && /opt/gpuq/bin/pip uninstall --quiet -y pip setuptools \
 && /opt/gpuq/bin/python -m compileall -q /opt/gpuq/lib

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="gpuq" \
      org.opencontainers.image.description="Kubernetes operator scheduling distributed training on GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpuq /opt/gpuq
# The non-root user, named (as distroless' nonroot): kopf identifies itself by user name.
RUN echo 'nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'nonroot:x:65532:' >> /etc/group
# Nothing is written at run time (bytecode is compiled above), so the root filesystem can be
# read-only; HOME points at /tmp, the one writable place the Deployment mounts.
ENV PATH=/opt/gpuq/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
ENTRYPOINT ["gpuq"]
CMD ["operator", "run"]

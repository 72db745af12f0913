# One image for every service of compose.yaml: the cdc CLI with Java for Spark and the Delta jars.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless postgresql-client \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cdc cdc
COPY log_store log_store
COPY derived_views derived_views
COPY event_format event_format
COPY migrations migrations
COPY local_servers local_servers
RUN pip install --no-cache-dir . \
 && CDC_SPARK_JARS_DIR=/opt/cdc/jars python -m derived_views.engine.spark_jars \
 && CDC_SPARK_JARS_DIR=/opt/cdc/jars python -m derived_views.engine.archive_build
ENV CDC_SPARK_JARS_DIR=/opt/cdc/jars \
    CDC_DATA_DIR=/data
VOLUME /data
ENTRYPOINT ["cdc"]

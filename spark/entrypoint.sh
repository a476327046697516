#!/usr/bin/env bash
# Entrypoint of the Spark image. Spark-on-Kubernetes starts its pods with a role as the first
# argument and describes the rest in environment variables:
#   driver ARGS...   the driver pod of a cluster-mode submission: runs spark-submit in client mode
#                    inside the pod, bound to the pod IP (SPARK_DRIVER_BIND_ADDRESS)
#   executor         an executor pod: runs the Kubernetes executor backend, connecting back to
#                    SPARK_DRIVER_URL as executor SPARK_EXECUTOR_ID
#   submit ARGS...   spark-submit ARGS (the operator's planner submission pod); when it fails,
#                    the lines that say why go to the pod's termination message, which the
#                    operator puts in the resource's status (a JVM stack trace's tail would not)
# Anything else is run as a command (e.g. `spark-submit ...`, `python3 job.py`, `bash`).
set -euo pipefail

# Spark's own jars plus the configuration directory Spark mounts into its pods.
spark_classpath() {
  local cp="${SPARK_CLASSPATH:-}"
  [[ -n "${SPARK_CONF_DIR:-}" ]] && cp="$SPARK_CONF_DIR${cp:+:$cp}"
  echo "${cp:+$cp:}$SPARK_HOME/jars/*"
}

# The JVM options Spark passes to executors as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
executor_java_opts() {
  local i=0 name
  while :; do
    name="SPARK_JAVA_OPT_$i"
    [[ -n "${!name+set}" ]] || break
    printf '%s\0' "${!name}"
    i=$((i + 1))
  done
}

run_driver() {
  : "${SPARK_DRIVER_BIND_ADDRESS:?the driver pod must set SPARK_DRIVER_BIND_ADDRESS}"
  exec "$SPARK_HOME/bin/spark-submit" \
    --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
    --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
    --deploy-mode client \
    "$@"
}

run_executor() {
  local var
  for var in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_APPLICATION_ID \
    SPARK_EXECUTOR_POD_IP SPARK_EXECUTOR_MEMORY; do
    [[ -n "${!var:-}" ]] || { echo "entrypoint: executor needs $var" >&2; exit 64; }
  done
  local -a java_opts=()
  mapfile -d '' -t java_opts < <(executor_java_opts)
  exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
    -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
    -cp "$(spark_classpath)" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "$SPARK_DRIVER_URL" \
    --executor-id "$SPARK_EXECUTOR_ID" \
    --cores "$SPARK_EXECUTOR_CORES" \
    --app-id "$SPARK_APPLICATION_ID" \
    --hostname "$SPARK_EXECUTOR_POD_IP" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME:-$(hostname)}"
}

run_submit() {
  local log rc
  log=$(mktemp)
  set +e
  "$SPARK_HOME/bin/spark-submit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if ((rc)) && [[ -w /dev/termination-log ]]; then
    grep -E 'Exception|Error|ERROR|Forbidden|Failure|refused|denied' "$log" \
      | grep -vE '^[[:space:]]+at ' | head -n 12 | cut -c1-300 >/dev/termination-log || true
  fi
  exit "$rc"
}

main() {
  local role="${1:-}"
  case "$role" in
    driver) shift; run_driver "$@" ;;
    executor) shift; run_executor ;;
    submit) shift; run_submit "$@" ;;
    "") exec bash ;;
    *) exec "$@" ;;
  esac
}

main "$@"

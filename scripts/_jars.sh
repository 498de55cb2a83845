# Sourced by scripts/test: fetches from Maven Central into .jars/ what the tests' servers and
# Spark's connectors need, and points the tests at them:
#   ABS_KAFKA_BROKER  a Kafka broker's jars (KRaft, run by tests/support/kafka.py)
#   ABS_KAFKA_JARS    Spark's Kafka connector
#   ABS_S3_JARS       Hadoop's S3A file system with the AWS SDK modules it uses (not the
#                     600 MB SDK bundle); Spark brings its own Netty, HTTP client and logging
KAFKA=4.1.1
CONNECTOR=4.2.0  # the newest spark-sql-kafka on Maven Central; it runs on Spark 4.3 too
HADOOP=3.5.0     # Spark 4.x's Hadoop client
AWS_SDK=2.35.4   # the SDK that Hadoop 3.5.0 is built against
broker=".jars/kafka-$KAFKA"
connector=".jars/spark-kafka-$CONNECTOR"
s3a=".jars/hadoop-aws-$HADOOP"

# fetch_dependencies DIR DEPENDENCIES: copy the runtime closure of the <dependency> elements
fetch_dependencies() {
    local pom
    pom="$(mktemp -d)"
    cat > "$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>pyspark-abs</groupId><artifactId>test-jars</artifactId><version>1</version>
<dependencies>$2</dependencies></project>
POM
    mvn --batch-mode --quiet -f "$pom/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$PWD/$1"
    rm -rf "$pom"
}

# dependency GROUP ARTIFACT VERSION [EXCLUDED-GROUP...]
dependency() {
    local exclusions="" group
    for group in "${@:4}"; do
        exclusions+="<exclusion><groupId>$group</groupId><artifactId>*</artifactId></exclusion>"
    done
    echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version><exclusions>$exclusions</exclusions></dependency>"
}

if [ ! -f "$broker/kafka_2.13-$KAFKA.jar" ]; then
    fetch_dependencies "$broker" "$(dependency org.apache.kafka kafka_2.13 $KAFKA)"
fi
if [ ! -f "$connector/spark-sql-kafka-0-10_2.13-$CONNECTOR.jar" ]; then
    mkdir -p "$connector"
    for artifact in "org.apache.spark:spark-sql-kafka-0-10_2.13:$CONNECTOR" \
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:$CONNECTOR" \
        "org.apache.kafka:kafka-clients:3.9.2" "org.apache.commons:commons-pool2:2.13.1"; do
        mvn --batch-mode --quiet dependency:copy -Dartifact="$artifact" -DoutputDirectory="$connector"
    done
fi
if [ ! -f "$s3a/hadoop-aws-$HADOOP.jar" ]; then
    provided=(io.netty org.slf4j commons-logging commons-codec org.apache.httpcomponents)
    sdk=""
    for module in s3 s3-transfer-manager sts; do
        sdk+="$(dependency software.amazon.awssdk $module $AWS_SDK "${provided[@]}")"
    done
    fetch_dependencies "$s3a" "$(dependency org.apache.hadoop hadoop-aws $HADOOP '*')$sdk$(
        dependency software.amazon.s3.analyticsaccelerator analyticsaccelerator-s3 1.3.1 \
            software.amazon.awssdk "${provided[@]}")"
fi
export ABS_KAFKA_BROKER="$PWD/$broker"
ABS_KAFKA_JARS="$(ls "$PWD/$connector"/*.jar | paste -sd,)"
ABS_S3_JARS="$(ls "$PWD/$s3a"/*.jar | paste -sd,)"
export ABS_KAFKA_JARS ABS_S3_JARS

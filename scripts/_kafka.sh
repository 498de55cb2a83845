# Sourced by scripts/test: fetches a Kafka broker's jars and Spark's Kafka connector from
# Maven Central into .jars/, and points the tests at them (ABS_KAFKA_BROKER, ABS_KAFKA_JARS).
KAFKA=4.1.1
CONNECTOR=4.2.0  # the newest spark-sql-kafka on Maven Central; it runs on Spark 4.3 too
broker=".jars/kafka-$KAFKA"
connector=".jars/spark-kafka-$CONNECTOR"
if [ ! -f "$broker/kafka_2.13-$KAFKA.jar" ]; then
    pom="$(mktemp -d)"
    cat > "$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>pyspark-abs</groupId><artifactId>test-broker</artifactId><version>1</version>
<dependencies><dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
<version>$KAFKA</version></dependency></dependencies></project>
POM
    mvn --batch-mode --quiet -f "$pom/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$PWD/$broker"
    rm -rf "$pom"
fi
if [ ! -f "$connector/spark-sql-kafka-0-10_2.13-$CONNECTOR.jar" ]; then
    mkdir -p "$connector"
    for artifact in "org.apache.spark:spark-sql-kafka-0-10_2.13:$CONNECTOR" \
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:$CONNECTOR" \
        "org.apache.kafka:kafka-clients:3.9.2" "org.apache.commons:commons-pool2:2.13.1"; do
        mvn --batch-mode --quiet dependency:copy -Dartifact="$artifact" -DoutputDirectory="$connector"
    done
fi
export ABS_KAFKA_BROKER="$PWD/$broker"
ABS_KAFKA_JARS="$(ls "$PWD/$connector"/*.jar | paste -sd,)"
export ABS_KAFKA_JARS

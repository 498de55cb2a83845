# Sourced by scripts/test and scripts/test_spark_versions after scripts/_env.sh. The JVMs a
# test run starts (its session, its children's, the Kafka broker) run with C1 alone and the
# serial collector, which spend less of 2 cores on compiling and collecting than C2 gains
# back even in the session that lives through the whole run, and map the classes a pipeline
# loads from an archive made once per venv and Java (scripts/_archive_classes.py) instead of
# loading them again. A JVM on another class path (Maven, the broker) silently runs without
# the archive. C1 alone gets a 48 MB code cache, which a session's JVM filled within two test
# files (it then evicts and compiles again, and a JVM that fills it stops compiling): 256 MB
# cut the CPU of two test files by a tenth. The caller's own JAVA_TOOL_OPTIONS come last, so
# they win.
ABS_CALLER_JAVA_OPTIONS="${ABS_CALLER_JAVA_OPTIONS-${JAVA_TOOL_OPTIONS:-}}"
export ABS_CALLER_JAVA_OPTIONS
jvm_flags="-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -XX:+UseSerialGC -Xlog:cds=off -Xlog:cds+dynamic=off"
java_version="$(env -u JAVA_TOOL_OPTIONS java -version 2>&1 | grep -m1 version | cut -d'"' -f2)"
archive="$PWD/$VENV/classes-java$java_version-spark$(python -c 'import pyspark; print(pyspark.__version__)').jsa"
if [ ! -f "$archive" ]; then
    echo "archiving the classes a pipeline loads into $archive" >&2
    # spark-submit's JVM is the parent: it has written the archive when spark-submit returns
    if JAVA_TOOL_OPTIONS="$jvm_flags -XX:ArchiveClassesAtExit=$archive.part" \
        PYSPARK_PYTHON="$(command -v python)" spark-submit scripts/_archive_classes.py \
        >"$VENV/archive-classes.log" 2>&1; then
        mv "$archive.part" "$archive"
    else
        echo "could not archive the classes (see $VENV/archive-classes.log); running without" >&2
        rm -f "$archive.part"
    fi
fi
if [ -f "$archive" ]; then
    jvm_flags="$jvm_flags -XX:SharedArchiveFile=$archive"
fi
export JAVA_TOOL_OPTIONS="$jvm_flags $ABS_CALLER_JAVA_OPTIONS"

package pidctl.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * pidctl-kafka's JVM carrier: Spark's tasks write the rows in the JVM, with the producer ids
 * and the plan that {@code write_kafka} decided on the driver (ops/spark/kafka_write.py), as
 * the SQL sink lets Spark's JDBC writer carry its rows. One option, {@code plan}, a JSON object
 * (ops/spark/carrier.py writes it); the tasks (CarrierWriter) write, and what each wrote goes
 * back to the Python driver through {@link #reports(String)}. Nothing here decides whether to
 * write: the driver did.
 */
public final class KafkaCarrier implements TableProvider {
  /** Reports of finished writes, by the plan's write id, until the driver takes them. */
  private static final Map<String, List<String>> REPORTS = new ConcurrentHashMap<>();

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return new StructType();
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
    return new CarrierTable(schema);
  }

  /** The reports (one JSON object per Kafka partition a task wrote) of write {@code id}, as a
   * JSON array; null if none arrived. Taken: a second call returns null. */
  public static String reports(String id) {
    List<String> found = REPORTS.remove(id);
    return found == null ? null : "[" + String.join(",", found) + "]";
  }

  static Plan plan(Map<String, String> options) {
    String json = options.get("plan");
    if (json == null) {
      throw new IllegalArgumentException("pidctl-kafka's carrier needs its plan option");
    }
    try {
      return new Plan(new ObjectMapper().readTree(json));
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException("pidctl-kafka's carrier: a bad plan: " + e, e);
    }
  }

  static final class CarrierTable implements Table, SupportsWrite {
    private final StructType schema;

    CarrierTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return "pidctl-kafka-carrier";
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_WRITE);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      Plan plan = plan(info.options().asCaseSensitiveMap());
      StructType input = info.schema();
      return new WriteBuilder() {
        @Override
        public Write build() {
          return new Write() {
            @Override
            public BatchWrite toBatch() {
              return new CarrierBatch(plan, input);
            }
          };
        }
      };
    }
  }

  static final class CarrierBatch implements BatchWrite {
    private final Plan plan;
    private final StructType input;

    CarrierBatch(Plan plan, StructType input) {
      this.plan = plan;
      this.input = input;
    }

    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      return new Factory(plan, input);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
      List<String> all = new ArrayList<>();
      for (WriterCommitMessage message : messages) {
        if (message instanceof Report) {
          all.addAll(((Report) message).partitions);
        }
      }
      REPORTS.put(plan.writeId, all);
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {}
  }

  static final class Factory implements DataWriterFactory {
    private static final long serialVersionUID = 1L;
    private final Plan plan;
    private final StructType input;

    Factory(Plan plan, StructType input) {
      this.plan = plan;
      this.input = input;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      return new CarrierWriter(plan, input, partitionId);
    }
  }

  /** What one task wrote: a JSON object per Kafka partition. */
  static final class Report implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;
    final ArrayList<String> partitions;

    Report(List<String> partitions) {
      this.partitions = new ArrayList<>(partitions);
    }
  }

  /** The driver's plan, as {@code carrier.py} writes it. */
  static final class Plan implements Serializable {
    private static final long serialVersionUID = 1L;
    final String writeId;
    final List<String> bootstrap = new ArrayList<>();
    final String topic; // null: the rows' topic column
    final HashMap<String, Integer> partitions = new HashMap<>();
    final long[] blockFirst;
    final int[] blockLength;
    final short epoch;
    final HashMap<Integer, List<long[]>> expected = new HashMap<>(); // spark partition ->
    final List<String> expectedTopics = new ArrayList<>(); // the topics of expected's rows
    final long startedMs;
    final long expirationMs;
    final String appId; // "" without a name
    final long version; // -1 without a name
    final int batchBytes;
    final int requestTimeoutMs;
    final long deliveryTimeoutMs;
    final long retryBackoffMs;
    final long retryBackoffMaxMs;
    final long retries;
    final int compression;
    final String clientId;

    Plan(JsonNode json) {
      writeId = json.get("write_id").asText();
      json.get("bootstrap").forEach(node -> bootstrap.add(node.asText()));
      topic = json.get("topic").isNull() ? null : json.get("topic").asText();
      json.get("partitions").fields().forEachRemaining(e -> partitions.put(e.getKey(), e.getValue().asInt()));
      JsonNode blocks = json.get("blocks");
      blockFirst = new long[blocks.size()];
      blockLength = new int[blocks.size()];
      for (int i = 0; i < blocks.size(); i++) {
        blockFirst[i] = blocks.get(i).get(0).asLong();
        blockLength[i] = blocks.get(i).get(1).asInt();
      }
      epoch = (short) json.get("epoch").asInt();
      json.get("expected").fields().forEachRemaining(e -> {
        List<long[]> rows = new ArrayList<>();
        e.getValue().forEach(node -> {
          String name = node.get(0).asText();
          int index = expectedTopics.indexOf(name);
          if (index < 0) {
            expectedTopics.add(name);
            index = expectedTopics.size() - 1;
          }
          rows.add(new long[] {index, node.get(1).asLong(), node.get(2).asLong(), node.get(3).asLong()});
        });
        expected.put(Integer.parseInt(e.getKey()), rows);
      });
      startedMs = json.get("started_ms").asLong();
      expirationMs = json.get("expiration_ms").asLong();
      appId = json.get("app_id").asText();
      version = json.get("version").asLong();
      batchBytes = json.get("batch_bytes").asInt();
      requestTimeoutMs = json.get("request_timeout_ms").asInt();
      deliveryTimeoutMs = json.get("delivery_timeout_ms").asLong();
      retryBackoffMs = json.get("retry_backoff_ms").asLong();
      retryBackoffMaxMs = json.get("retry_backoff_max_ms").asLong();
      retries = json.get("retries").asLong();
      compression = json.get("compression").asInt();
      clientId = json.get("client_id").asText();
    }

    /** The producer id of Spark partition {@code partition}: the i-th across the blocks. */
    long producerId(int partition) {
      int index = partition;
      for (int i = 0; i < blockFirst.length; i++) {
        if (index < blockLength[i]) {
          return blockFirst[i] + index;
        }
        index -= blockLength[i];
      }
      throw new IllegalStateException(
          "partition " + partition + " is beyond the producer ids preallocated for the write");
    }
  }
}

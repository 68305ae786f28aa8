package pidctl.spark;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.DescribeProducersRequestData;
import org.apache.kafka.common.message.DescribeProducersResponseData;
import org.apache.kafka.common.message.FetchResponseData;
import org.apache.kafka.common.message.ListOffsetsRequestData;
import org.apache.kafka.common.message.ListOffsetsResponseData;
import org.apache.kafka.common.message.MetadataResponseData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.requests.AbstractRequest;
import org.apache.kafka.common.requests.AbstractResponse;
import org.apache.kafka.common.requests.DescribeProducersRequest;
import org.apache.kafka.common.requests.DescribeProducersResponse;
import org.apache.kafka.common.requests.FetchRequest;
import org.apache.kafka.common.requests.FetchResponse;
import org.apache.kafka.common.requests.ListOffsetsRequest;
import org.apache.kafka.common.requests.ListOffsetsResponse;
import org.apache.kafka.common.requests.MetadataRequest;
import org.apache.kafka.common.requests.MetadataResponse;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.requests.ResponseHeader;

/**
 * A Kafka cluster as the carrier sees it (the JVM's twin of ops/spark/kafka_cluster.py):
 * Metadata, and per broker two connections, one carrying only Produce requests and one for
 * every question (DescribeProducers, ListOffsets, Fetch) — a broker answers a connection's
 * requests in order, so a question never waits behind batches in flight. Requests and
 * responses are kafka-clients' own classes over a plain socket (PLAINTEXT).
 */
final class Wire implements Closeable {
  static final short PRODUCE = 9, METADATA = 12, DESCRIBE_PRODUCERS = 0, LIST_OFFSETS = 7;
  static final short FETCH = 12;
  static final int FETCH_BYTES = 4 << 20;
  static final long FIND_LIMIT_BYTES = 64L << 20;

  /** A question to the cluster. */
  interface Call<T> {
    T call() throws IOException;
  }

  /** No broker (or not the needed one) answers now: worth asking again within the budget. */
  static final class Unavailable extends IOException {
    Unavailable(String message, Throwable cause) {
      super(message, cause);
    }

    Unavailable(String message) {
      super(message);
    }
  }

  /** One connection: requests out, responses in, in order. */
  static final class Connection implements Closeable {
    private final Socket socket;
    private final DataOutputStream out;
    private final DataInputStream in;
    private final String clientId;
    private int correlation;

    Connection(String address, String clientId, int timeoutMs) throws IOException {
      int colon = address.lastIndexOf(':');
      socket = new Socket();
      socket.connect(
          new InetSocketAddress(address.substring(0, colon), Integer.parseInt(address.substring(colon + 1))),
          timeoutMs);
      socket.setTcpNoDelay(true);
      socket.setSoTimeout(timeoutMs);
      out = new DataOutputStream(new BufferedOutputStream(socket.getOutputStream(), 1 << 16));
      in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 1 << 16));
      this.clientId = clientId;
    }

    void send(AbstractRequest request) throws IOException {
      RequestHeader header =
          new RequestHeader(request.apiKey(), request.version(), clientId, correlation++);
      ByteBuffer buffer = request.serializeWithHeader(header);
      out.writeInt(buffer.remaining());
      out.write(buffer.array(), buffer.arrayOffset() + buffer.position(), buffer.remaining());
      out.flush();
    }

    AbstractResponse receive(ApiKeys key, short version) throws IOException {
      int size = in.readInt();
      byte[] data = new byte[size];
      in.readFully(data);
      ByteBuffer buffer = ByteBuffer.wrap(data);
      ResponseHeader.parse(buffer, key.responseHeaderVersion(version));
      return AbstractResponse.parseResponse(key, buffer, version);
    }

    AbstractResponse ask(AbstractRequest request) throws IOException {
      send(request);
      return receive(request.apiKey(), request.version());
    }

    @Override
    public void close() {
      try {
        socket.close();
      } catch (IOException ignored) {
        // closing a connection that failed
      }
    }
  }

  private final List<String> bootstrap;
  private final String clientId;
  private final int timeoutMs;
  private final Map<Integer, String> brokers = new HashMap<>();
  private final Map<Integer, Connection> producers = new HashMap<>();
  private final Map<Integer, Connection> admins = new HashMap<>();
  final Map<String, int[]> leaders = new HashMap<>();

  Wire(List<String> bootstrap, String clientId, int timeoutMs) {
    this.bootstrap = bootstrap;
    this.clientId = clientId;
    this.timeoutMs = timeoutMs;
  }

  /** Metadata for {@code topic}: its partitions' leaders (-1 while none). */
  void refresh(String topic) throws IOException {
    List<String> addresses = new ArrayList<>(bootstrap);
    addresses.addAll(brokers.values());
    IOException last = null;
    for (String address : addresses) {
      try (Connection c = new Connection(address, clientId, timeoutMs)) {
        MetadataResponse response = (MetadataResponse)
            c.ask(new MetadataRequest.Builder(List.of(topic), false).build(METADATA));
        for (MetadataResponseData.MetadataResponseBroker b : response.data().brokers()) {
          brokers.put(b.nodeId(), b.host() + ":" + b.port());
        }
        MetadataResponseData.MetadataResponseTopic t = response.data().topics().find(topic);
        Errors error = t == null ? Errors.UNKNOWN_TOPIC_OR_PARTITION : Errors.forCode(t.errorCode());
        if (error == Errors.UNKNOWN_TOPIC_OR_PARTITION) {
          throw new CarrierWriter.WriteError(
              "topic '" + topic + "' does not exist (the sink does not create topics)");
        }
        if (error != Errors.NONE && error != Errors.LEADER_NOT_AVAILABLE) {
          throw new CarrierWriter.WriteError("topic '" + topic + "': " + error.name());
        }
        int[] found = new int[t.partitions().size()];
        java.util.Arrays.fill(found, -1);
        for (MetadataResponseData.MetadataResponsePartition p : t.partitions()) {
          if (p.partitionIndex() < found.length) {
            found[p.partitionIndex()] = p.leaderId();
          }
        }
        leaders.put(topic, found);
        return;
      } catch (CarrierWriter.WriteError e) {
        throw e;
      } catch (IOException e) {
        last = e;
      }
    }
    throw new Unavailable("no Kafka broker of kafka.bootstrap.servers is reachable (" + last + ")", last);
  }

  int[] layout(String topic) throws IOException {
    int[] found = leaders.get(topic);
    if (found == null) {
      refresh(topic);
      found = leaders.get(topic);
    }
    return found;
  }

  int leader(String topic, int partition) throws IOException {
    int[] found = layout(topic);
    if (partition < 0 || partition >= found.length) {
      throw new CarrierWriter.WriteError("partition " + partition + " of topic '" + topic
          + "' is out of range: the topic has " + found.length + " partitions (column 'partition')");
    }
    return found[partition];
  }

  private Connection open(Map<Integer, Connection> pool, int broker) throws IOException {
    Connection c = pool.get(broker);
    if (c == null) {
      String address = brokers.get(broker);
      if (address == null) {
        throw new Unavailable("broker " + broker + " is not in the cluster's metadata");
      }
      try {
        c = new Connection(address, clientId, timeoutMs);
      } catch (IOException e) {
        throw new Unavailable("Kafka broker " + broker + " at " + address + ": " + e, e);
      }
      pool.put(broker, c);
    }
    return c;
  }

  /** The connection that carries Produce requests to {@code broker} (and nothing else). */
  Connection producer(int broker) throws IOException {
    return open(producers, broker);
  }

  void drop(int broker) {
    Connection c = producers.remove(broker);
    if (c != null) {
      c.close();
    }
  }

  private AbstractResponse askAdmin(int broker, AbstractRequest request) throws IOException {
    if (broker < 0) {
      throw new Unavailable("no leader now");
    }
    Connection c = open(admins, broker);
    try {
      return c.ask(request);
    } catch (IOException e) {
      admins.remove(broker);
      c.close();
      throw new Unavailable(request.apiKey() + " to broker " + broker + ": " + e, e);
    }
  }

  /** This producer's state on {@code topic}'s partitions: {last sequence, last timestamp,
   * epoch, in a transaction (1/0)} by partition; partitions where it is not active absent. */
  Map<Integer, long[]> describeProducer(String topic, int partitions, long producerId)
      throws IOException {
    Map<Integer, List<Integer>> byLeader = new HashMap<>();
    for (int p = 0; p < partitions; p++) {
      byLeader.computeIfAbsent(leader(topic, p), k -> new ArrayList<>()).add(p);
    }
    Map<Integer, long[]> found = new HashMap<>();
    for (Map.Entry<Integer, List<Integer>> e : byLeader.entrySet()) {
      DescribeProducersRequestData data = new DescribeProducersRequestData();
      data.topics().add(new DescribeProducersRequestData.TopicRequest()
          .setName(topic).setPartitionIndexes(e.getValue()));
      DescribeProducersResponse response = (DescribeProducersResponse)
          askAdmin(e.getKey(), new DescribeProducersRequest.Builder(data).build(DESCRIBE_PRODUCERS));
      for (DescribeProducersResponseData.TopicResponse t : response.data().topics()) {
        for (DescribeProducersResponseData.PartitionResponse p : t.partitions()) {
          Errors error = Errors.forCode(p.errorCode());
          if (error == Errors.NOT_LEADER_OR_FOLLOWER || error == Errors.LEADER_NOT_AVAILABLE) {
            throw new Unavailable("DescribeProducers for " + topic + "-" + p.partitionIndex() + ": leader moved");
          }
          if (error != Errors.NONE) {
            throw new CarrierWriter.WriteError("DescribeProducers for " + topic + "-"
                + p.partitionIndex() + ": " + error.name());
          }
          for (DescribeProducersResponseData.ProducerState s : p.activeProducers()) {
            if (s.producerId() == producerId) {
              found.put(p.partitionIndex(), new long[] {
                  s.lastSequence(), s.lastTimestamp(), s.producerEpoch(),
                  s.currentTxnStartOffset() != -1 ? 1 : 0});
            }
          }
        }
      }
    }
    return found;
  }

  private long offsetForTime(String topic, int partition, long timestamp) throws IOException {
    ListOffsetsRequestData.ListOffsetsTopic t = new ListOffsetsRequestData.ListOffsetsTopic()
        .setName(topic);
    t.partitions().add(new ListOffsetsRequestData.ListOffsetsPartition()
        .setPartitionIndex(partition).setTimestamp(timestamp));
    ListOffsetsResponse response = (ListOffsetsResponse) askAdmin(leader(topic, partition),
        ListOffsetsRequest.Builder.forConsumer(true, IsolationLevel.READ_UNCOMMITTED)
            .setTargetTimes(List.of(t)).build(LIST_OFFSETS));
    ListOffsetsResponseData.ListOffsetsPartitionResponse p =
        response.data().topics().get(0).partitions().get(0);
    if (p.errorCode() != 0) {
      throw new Unavailable("ListOffsets for " + topic + "-" + partition + ": " + Errors.forCode(p.errorCode()));
    }
    return p.offset();
  }

  private MemoryRecords fetch(String topic, int partition, long offset) throws IOException {
    TopicPartition tp = new TopicPartition(topic, partition);
    Map<TopicPartition, FetchRequest.PartitionData> data = new HashMap<>();
    data.put(tp, new FetchRequest.PartitionData(Uuid.ZERO_UUID, offset, -1, FETCH_BYTES, Optional.empty()));
    FetchResponse response = (FetchResponse) askAdmin(leader(topic, partition),
        FetchRequest.Builder.forConsumer(FETCH, 0, 0, data).setMaxBytes(FETCH_BYTES).build(FETCH));
    FetchResponseData.PartitionData p = response.responseData(Map.of(), FETCH).get(tp);
    if (p == null || p.errorCode() != 0) {
      throw new Unavailable("Fetch from " + topic + "-" + partition + ": "
          + (p == null ? "no answer" : Errors.forCode(p.errorCode()).name()));
    }
    return (MemoryRecords) FetchResponse.recordsOrFail(p);
  }

  /** The batch {@code producerId} wrote to the partition that ends at {@code lastSequence},
   * found from the first offset with its last timestamp on; null if it is not there. */
  RecordBatch findBatch(String topic, int partition, long producerId, long lastSequence, long timestamp)
      throws IOException {
    long offset = offsetForTime(topic, partition, timestamp);
    if (offset < 0) {
      return null;
    }
    long read = 0;
    while (read < FIND_LIMIT_BYTES) {
      MemoryRecords records = fetch(topic, partition, offset);
      long next = offset;
      for (org.apache.kafka.common.record.MutableRecordBatch batch : records.batches()) {
        if (batch.lastOffset() < offset) {
          continue;
        }
        if (batch.producerId() == producerId && batch.lastSequence() == lastSequence) {
          return batch;
        }
        read += batch.sizeInBytes();
        next = batch.lastOffset() + 1;
      }
      if (next == offset) {
        return null;
      }
      offset = next;
    }
    return null;
  }

  @Override
  public void close() {
    for (Connection c : producers.values()) {
      c.close();
    }
    for (Connection c : admins.values()) {
      c.close();
    }
    producers.clear();
    admins.clear();
  }
}

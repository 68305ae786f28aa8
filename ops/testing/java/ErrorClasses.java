import java.util.Locale;

import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.errors.ApplicationRecoverableException;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.RefreshRetriableException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TransactionAbortableException;
import org.apache.kafka.common.protocol.Errors;

/**
 * For each error code on the command line, the exception Kafka's Java client makes of it
 * (Errors.forCode(code).exception()) and its KIP-1050 class, one JSON object per line:
 * {"code": 14, "name": "COORDINATOR_LOAD_IN_PROGRESS", "exception": "...", "class": "retriable"}.
 */
public final class ErrorClasses {
    private ErrorClasses() {
    }

    static String kip1050Class(Errors error) {
        if (error == Errors.NONE) {
            return "none";
        }
        ApiException exception = error.exception();
        if (exception instanceof RefreshRetriableException) {
            return "refresh-retriable";
        }
        if (exception instanceof RetriableException) {
            return "retriable";
        }
        if (exception instanceof TransactionAbortableException) {
            return "abortable";
        }
        if (exception instanceof ApplicationRecoverableException) {
            return "application-recoverable";
        }
        if (exception instanceof InvalidConfigurationException) {
            return "invalid-configuration";
        }
        return "fatal";
    }

    public static void main(String[] args) {
        for (String arg : args) {
            Errors error = Errors.forCode(Short.parseShort(arg));
            String exception = error == Errors.NONE ? "" : error.exception().getClass().getName();
            System.out.println(String.format(Locale.ROOT,
                "{\"code\": %d, \"name\": \"%s\", \"exception\": \"%s\", \"class\": \"%s\"}",
                error.code(), error.name(), exception, kip1050Class(error)));
        }
    }
}

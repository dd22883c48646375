// SecuritySetup — run by deploy/local/kafka.sh on every start of a
// KAFKA_SECURITY=sasl_ssl broker, as user admin, in one JVM:
//
//   java -cp "<kafka libs>/*" SecuritySetup.java BOOTSTRAP SECURITY_DIR ACL_FILE USER...
//
// 1. creates, as SCRAM-SHA-512 users, those of USER... the cluster does not
//    have yet (a data dir formatted before a user was added to
//    KAFKA_SASL_USERS), each with the password in SECURITY_DIR/passwords/<user>;
// 2. creates the ACLs of ACL_FILE (one kafka-acls.sh --add command a line,
//    without the connection arguments) that the cluster does not have yet;
// 3. waits until the broker lists every user and every ACL.
//
// Passwords are read from their files, never taken from the command line.
// It prints one line saying what it created; errors go to stderr, exit 1.

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecuritySetup {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: SecuritySetup BOOTSTRAP SECURITY_DIR ACL_FILE USER...");
            System.exit(2);
        }
        Path dir = Path.of(args[1]);
        Set<AclBinding> acls = parse(Path.of(args[2]));
        List<String> users = List.of(args).subList(3, args.length);
        try (Admin admin = Admin.create(config(args[0], dir))) {
            List<String> missing = new ArrayList<>(users);
            missing.removeAll(scramUsers(admin));
            if (!missing.isEmpty()) {
                List<UserScramCredentialAlteration> upserts = new ArrayList<>();
                for (String u : missing) {
                    upserts.add(new UserScramCredentialUpsertion(u,
                            new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password(dir, u)));
                }
                admin.alterUserScramCredentials(upserts).all().get(60, TimeUnit.SECONDS);
            }
            Set<AclBinding> absent = new LinkedHashSet<>(acls);
            absent.removeAll(acls(admin));
            if (!absent.isEmpty()) {
                admin.createAcls(absent).all().get(60, TimeUnit.SECONDS);
            }
            // Both reach the broker through the metadata log.
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (!scramUsers(admin).containsAll(users) || !acls(admin).containsAll(acls)) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("the broker does not list every user and ACL after 60 s");
                }
                Thread.sleep(100);
            }
            System.out.printf("created %s; created %d of the %d ACLs%n",
                    missing.isEmpty() ? "no SCRAM user" : "the SCRAM users " + String.join(" ", missing),
                    absent.size(), acls.size());
        }
    }

    // The admin client: SCRAM-SHA-512 as admin over TLS, with the client
    // certificate the listener requires.
    static Properties config(String bootstrap, Path dir) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_SSL");
        p.put("sasl.mechanism", "SCRAM-SHA-512");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\""
                + password(dir, "admin") + "\";");
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", dir.resolve("ca.pem").toString());
        p.put("ssl.keystore.type", "PEM");
        p.put("ssl.keystore.certificate.chain", Files.readString(dir.resolve("client.pem")));
        p.put("ssl.keystore.key", Files.readString(dir.resolve("client-key.pem")));
        p.put("default.api.timeout.ms", "60000");
        return p;
    }

    static String password(Path dir, String user) throws Exception {
        return Files.readString(dir.resolve("passwords").resolve(user)).strip();
    }

    static Set<String> scramUsers(Admin admin) throws Exception {
        return admin.describeUserScramCredentials().all().get(60, TimeUnit.SECONDS).keySet();
    }

    static Set<AclBinding> acls(Admin admin) throws Exception {
        return new HashSet<>(admin.describeAcls(AclBindingFilter.ANY).values().get(60, TimeUnit.SECONDS));
    }

    // parse reads the ACL file: every line a kafka-acls.sh --add command's
    // principals, operations and resources; # starts a comment.
    static Set<AclBinding> parse(Path file) throws Exception {
        Set<AclBinding> out = new LinkedHashSet<>();
        int n = 0;
        for (String line : Files.readAllLines(file)) {
            n++;
            line = line.strip();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String where = file + ":" + n + ": ";
            List<String> principals = new ArrayList<>();
            List<AclOperation> ops = new ArrayList<>();
            List<ResourcePattern> resources = new ArrayList<>();
            List<String[]> named = new ArrayList<>();
            PatternType pattern = PatternType.LITERAL;
            String[] f = line.split("\\s+");
            for (int i = 0; i < f.length; i++) {
                String flag = f[i];
                if (flag.equals("--cluster")) {
                    named.add(new String[] {"cluster", "kafka-cluster"});
                    continue;
                }
                if (i + 1 >= f.length) {
                    throw new IllegalArgumentException(where + flag + " needs a value");
                }
                String v = f[++i];
                switch (flag) {
                    case "--allow-principal" -> principals.add(v);
                    case "--operation" -> ops.add(operation(where, v));
                    case "--topic", "--group", "--transactional-id" -> named.add(new String[] {flag, v});
                    case "--resource-pattern-type" -> pattern = switch (v) {
                        case "literal" -> PatternType.LITERAL;
                        case "prefixed" -> PatternType.PREFIXED;
                        default -> throw new IllegalArgumentException(where + "pattern type must be literal or prefixed, got " + v);
                    };
                    default -> throw new IllegalArgumentException(where + "unknown argument " + flag);
                }
            }
            for (String[] r : named) {
                ResourceType type = switch (r[0]) {
                    case "--topic" -> ResourceType.TOPIC;
                    case "--group" -> ResourceType.GROUP;
                    case "--transactional-id" -> ResourceType.TRANSACTIONAL_ID;
                    default -> ResourceType.CLUSTER;
                };
                resources.add(new ResourcePattern(type, r[1], type == ResourceType.CLUSTER ? PatternType.LITERAL : pattern));
            }
            if (principals.isEmpty() || ops.isEmpty() || resources.isEmpty()) {
                throw new IllegalArgumentException(where + "want a principal, an operation and a resource");
            }
            for (String p : principals) {
                for (AclOperation op : ops) {
                    for (ResourcePattern r : resources) {
                        out.add(new AclBinding(r, new AccessControlEntry(p, "*", op, AclPermissionType.ALLOW)));
                    }
                }
            }
        }
        return out;
    }

    // operation maps kafka-acls.sh's names (Read, DescribeConfigs) to the enum.
    static AclOperation operation(String where, String name) {
        for (AclOperation op : AclOperation.values()) {
            if (op.name().replace("_", "").equalsIgnoreCase(name) && op != AclOperation.ANY && op != AclOperation.UNKNOWN) {
                return op;
            }
        }
        throw new IllegalArgumentException(where + "unknown operation " + name);
    }
}

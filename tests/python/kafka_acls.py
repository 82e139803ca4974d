"""Grant or revoke Kafka ACLs for tests/secured.rs, with confluent-kafka's admin client.

    kafka_acls.py add|remove BOOTSTRAP PRINCIPAL < lines

Each line of stdin: RESOURCE_TYPE NAME PATTERN OPERATION, e.g. `topic in-x literal read`,
`group g prefixed read`, `transactional_id watchbridge-g- prefixed write`,
`cluster kafka-cluster literal describe_configs`. Allowed from any host. Exits non-zero,
naming the line, if the broker refuses one.
"""

import sys

from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, AdminClient, ResourcePatternType,
                                   ResourceType)

action, bootstrap, principal = sys.argv[1:4]
admin = AdminClient({"bootstrap.servers": bootstrap})
bindings = []
for line in sys.stdin:
    if not line.strip():
        continue
    kind, name, pattern, operation = line.split()
    args = (ResourceType[kind.upper()], name, ResourcePatternType[pattern.upper()], principal,
            "*", AclOperation[operation.upper()], AclPermissionType.ALLOW)
    bindings.append((line.strip(), AclBinding(*args) if action == "add" else AclBindingFilter(*args)))
if not bindings:
    sys.exit(0)
call = admin.create_acls if action == "add" else admin.delete_acls
futures = call([b for _, b in bindings], request_timeout=15)
failed = False
for line, binding in bindings:
    try:
        futures[binding].result()
    except Exception as e:  # one line's refusal, named
        print(f"{action} `{line}`: {e}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)

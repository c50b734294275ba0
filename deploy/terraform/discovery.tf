# Cloud Map: a private DNS namespace (trainyard.local) in the VPC, and one service each for the
# head and the workers. ECS registers every task's address (an A record, awsvpc networking), so
# workers reach the head as head.trainyard.local, the name in their --head.

resource "aws_service_discovery_private_dns_namespace" "this" {
  name        = local.namespace.Name
  description = local.namespace.Description
  vpc         = var.vpc_id
  tags        = var.tags
}

resource "aws_service_discovery_service" "head" {
  name        = local.head_discovery.Name
  description = local.head_discovery.Description
  dns_config {
    namespace_id   = aws_service_discovery_private_dns_namespace.this.id
    routing_policy = local.head_discovery.DnsConfig.RoutingPolicy
    dns_records {
      type = local.head_discovery.DnsConfig.DnsRecords[0].Type
      ttl  = local.head_discovery.DnsConfig.DnsRecords[0].TTL
    }
  }
  health_check_custom_config {
    failure_threshold = local.head_discovery.HealthCheckCustomConfig.FailureThreshold
  }
  tags = var.tags
}

resource "aws_service_discovery_service" "worker" {
  name        = local.worker_discovery.Name
  description = local.worker_discovery.Description
  dns_config {
    namespace_id   = aws_service_discovery_private_dns_namespace.this.id
    routing_policy = local.worker_discovery.DnsConfig.RoutingPolicy
    dns_records {
      type = local.worker_discovery.DnsConfig.DnsRecords[0].Type
      ttl  = local.worker_discovery.DnsConfig.DnsRecords[0].TTL
    }
  }
  health_check_custom_config {
    failure_threshold = local.worker_discovery.HealthCheckCustomConfig.FailureThreshold
  }
  tags = var.tags
}

# One security group for the head and the workers. Ranks talk to each other on ports the agent
# picks at run time (the c10d store's MASTER_PORT, Gloo's pairs), so members reach members on every
# TCP port; clients outside reach only the head's API.

resource "aws_security_group" "tasks" {
  name        = "${var.name}-tasks"
  description = "trainyard head and workers"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "members" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "head API, rendezvous and collectives between trainyard tasks"
  referenced_security_group_id = aws_security_group.tasks.id
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
}

resource "aws_vpc_security_group_ingress_rule" "clients" {
  for_each          = toset(var.client_cidr_blocks)
  security_group_id = aws_security_group.tasks.id
  description       = "trainyard submit/status and the dashboard"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.head_port
  to_port           = local.head_port
}

resource "aws_vpc_security_group_egress_rule" "all" {
  security_group_id = aws_security_group.tasks.id
  description       = "image pulls, Secrets Manager, S3, CloudWatch Logs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}

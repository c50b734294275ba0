# trainyard on ECS: a head service and a worker service, the workers finding the head as
# head.trainyard.local through Cloud Map. The task definitions, the services' settings and the
# Cloud Map names are read from ../ecs/*.json, the files `aws ecs register-task-definition` and
# `aws ecs create-service` take, so the two ways of deploying cannot drift apart.

data "aws_region" "current" {}
data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}

locals {
  # ${...} placeholders of ../ecs/*-task-definition.json (envsubst's syntax and templatefile's).
  # The role ARNs are built from the roles' names so that the definitions are known at plan time.
  template_vars = {
    IMAGE              = var.image
    TOKEN_SECRET_ARN   = var.token_secret_arn
    TASK_ROLE_ARN      = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:role/${local.task_role_name}"
    EXECUTION_ROLE_ARN = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:role/${local.execution_role_name}"
    LOG_GROUP          = local.log_group
    AWS_REGION         = data.aws_region.current.name
  }
  head_task = jsondecode(templatefile("${path.module}/../ecs/head-task-definition.json", local.template_vars))
  worker_task = jsondecode(templatefile(
    var.worker_gpu ? "${path.module}/../ecs/worker-gpu-task-definition.json" : "${path.module}/../ecs/worker-task-definition.json",
    local.template_vars))

  # The services' own settings; their ${...} placeholders (cluster, subnets, ...) are this
  # module's resources, set below, so these files are read without templating.
  head_service = jsondecode(file("${path.module}/../ecs/head-service.json"))
  worker_service = jsondecode(file(
    var.worker_gpu ? "${path.module}/../ecs/worker-gpu-service.json" : "${path.module}/../ecs/worker-service.json"))

  namespace        = jsondecode(file("${path.module}/../ecs/cloud-map-namespace.json"))
  head_discovery   = jsondecode(file("${path.module}/../ecs/head-discovery-service.json"))
  worker_discovery = jsondecode(file("${path.module}/../ecs/worker-discovery-service.json"))

  head_port    = local.head_task.containerDefinitions[0].portMappings[0].containerPort
  head_address = "${local.head_discovery.Name}.${local.namespace.Name}:${local.head_port}"
  cluster_arn  = var.cluster_arn != null ? var.cluster_arn : aws_ecs_cluster.this[0].arn
  log_group    = "/ecs/${var.name}"
}

resource "aws_ecs_cluster" "this" {
  count = var.cluster_arn == null ? 1 : 0
  name  = var.name
  setting {
    name  = "containerInsights"
    value = "enabled"
  }
  tags = var.tags
}

resource "aws_cloudwatch_log_group" "this" {
  name              = local.log_group
  retention_in_days = var.log_retention_days
  tags              = var.tags
}

resource "aws_ecs_task_definition" "head" {
  family                   = local.head_task.family
  network_mode             = local.head_task.networkMode
  requires_compatibilities = local.head_task.requiresCompatibilities
  cpu                      = local.head_task.cpu
  memory                   = local.head_task.memory
  task_role_arn            = aws_iam_role.task.arn
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions    = jsonencode(local.head_task.containerDefinitions)
  runtime_platform {
    operating_system_family = local.head_task.runtimePlatform.operatingSystemFamily
    cpu_architecture        = local.head_task.runtimePlatform.cpuArchitecture
  }
  tags = var.tags
}

resource "aws_ecs_task_definition" "worker" {
  family                   = local.worker_task.family
  network_mode             = local.worker_task.networkMode
  requires_compatibilities = local.worker_task.requiresCompatibilities
  cpu                      = local.worker_task.cpu
  memory                   = local.worker_task.memory
  task_role_arn            = aws_iam_role.task.arn
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions    = jsonencode(local.worker_task.containerDefinitions)
  runtime_platform {
    operating_system_family = local.worker_task.runtimePlatform.operatingSystemFamily
    cpu_architecture        = local.worker_task.runtimePlatform.cpuArchitecture
  }
  tags = var.tags
}

resource "aws_ecs_service" "head" {
  name                               = local.head_service.serviceName
  cluster                            = local.cluster_arn
  task_definition                    = aws_ecs_task_definition.head.arn
  desired_count                      = local.head_service.desiredCount
  launch_type                        = local.head_service.launchType
  deployment_maximum_percent         = local.head_service.deploymentConfiguration.maximumPercent
  deployment_minimum_healthy_percent = local.head_service.deploymentConfiguration.minimumHealthyPercent
  enable_execute_command             = var.enable_execute_command
  propagate_tags                     = local.head_service.propagateTags
  deployment_circuit_breaker {
    enable   = local.head_service.deploymentConfiguration.deploymentCircuitBreaker.enable
    rollback = local.head_service.deploymentConfiguration.deploymentCircuitBreaker.rollback
  }
  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = local.head_service.networkConfiguration.awsvpcConfiguration.assignPublicIp == "ENABLED"
  }
  service_registries {
    registry_arn = aws_service_discovery_service.head.arn
  }
  tags = merge(var.tags, { for t in local.head_service.tags : t.key => t.value })
}

resource "aws_ecs_service" "worker" {
  name                               = local.worker_service.serviceName
  cluster                            = local.cluster_arn
  task_definition                    = aws_ecs_task_definition.worker.arn
  desired_count                      = var.worker_count
  launch_type                        = try(local.worker_service.launchType, null)
  deployment_maximum_percent         = local.worker_service.deploymentConfiguration.maximumPercent
  deployment_minimum_healthy_percent = local.worker_service.deploymentConfiguration.minimumHealthyPercent
  enable_execute_command             = var.enable_execute_command
  propagate_tags                     = local.worker_service.propagateTags
  dynamic "capacity_provider_strategy" {
    for_each = var.worker_gpu ? [var.gpu_capacity_provider] : []
    content {
      capacity_provider = capacity_provider_strategy.value
      weight            = 1
    }
  }
  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = local.worker_service.networkConfiguration.awsvpcConfiguration.assignPublicIp == "ENABLED"
  }
  service_registries {
    registry_arn = aws_service_discovery_service.worker.arn
  }
  tags = merge(var.tags, { for t in local.worker_service.tags : t.key => t.value })
  # Workers retry the head's name until it answers, but starting them after it keeps the first
  # minutes' logs quiet.
  depends_on = [aws_ecs_service.head]
  lifecycle {
    precondition {
      condition     = !var.worker_gpu || var.gpu_capacity_provider != null
      error_message = "worker_gpu is true but gpu_capacity_provider is null: name the capacity provider of your GPU instances (e.g. an Auto Scaling group of g5.xlarge)."
    }
  }
}

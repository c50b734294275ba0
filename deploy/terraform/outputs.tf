output "cluster_arn" {
  description = "The ECS cluster the services run in."
  value       = local.cluster_arn
}

output "head_address" {
  description = "The head's HOST:PORT inside the VPC, as the workers' --head names it."
  value       = local.head_address
}

output "head_url" {
  description = "TRAINYARD_ADDRESS for clients inside the VPC (trainyard status, submit)."
  value       = "http://${local.head_address}"
}

output "namespace_id" {
  description = "The Cloud Map private DNS namespace (trainyard.local)."
  value       = aws_service_discovery_private_dns_namespace.this.id
}

output "head_service_name" {
  description = "The ECS service of the head (aws ecs execute-command ... --command 'trainyard status')."
  value       = aws_ecs_service.head.name
}

output "worker_service_name" {
  description = "The ECS service of the workers; scale with worker_count."
  value       = aws_ecs_service.worker.name
}

output "head_task_definition_arn" {
  description = "The head's task definition revision."
  value       = aws_ecs_task_definition.head.arn
}

output "worker_task_definition_arn" {
  description = "The workers' task definition revision."
  value       = aws_ecs_task_definition.worker.arn
}

output "task_role_arn" {
  description = "The role whose credentials the tasks' S3 checkpoints use."
  value       = aws_iam_role.task.arn
}

output "security_group_id" {
  description = "The tasks' security group; add rules to it for other clients."
  value       = aws_security_group.tasks.id
}

output "log_group_name" {
  description = "The CloudWatch Logs group of the head and the workers (streams head/..., worker/...)."
  value       = aws_cloudwatch_log_group.this.name
}

output "checkpoint_storage" {
  description = "A --storage value for trainyard submit ... trainyard train ... that the task role may write."
  value       = "s3://${var.checkpoint_bucket}/${trimsuffix(var.checkpoint_prefix, "/")}"
}

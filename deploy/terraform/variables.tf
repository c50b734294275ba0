variable "name" {
  description = "Prefix of the cluster, IAM roles, security group and log group this module creates. The task families, service names and the Cloud Map names come from ../ecs/*.json."
  type        = string
  default     = "trainyard"
}

variable "cluster_arn" {
  description = "An existing ECS cluster to run the services in; null creates one named var.name."
  type        = string
  default     = null
}

variable "vpc_id" {
  description = "The VPC of the tasks and of the trainyard.local private DNS namespace."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets of the tasks (one subnet keeps every node in one Availability Zone, as the seeds deploy it)."
  type        = list(string)
  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "subnet_ids is empty: give at least one private subnet of var.vpc_id."
  }
}

variable "image" {
  description = "The trainyard container image (built from the repository's Dockerfile), with /usr/local/bin/trainyard in it."
  type        = string
}

variable "worker_count" {
  description = "Worker tasks (nodes) to run."
  type        = number
  default     = 2
  validation {
    condition     = var.worker_count >= 0 && floor(var.worker_count) == var.worker_count
    error_message = "worker_count must be a whole number of tasks, 0 or more."
  }
}

variable "worker_gpu" {
  description = "Run the GPU worker definition (../ecs/worker-gpu-task-definition.json, EC2 GPU instances through gpu_capacity_provider) instead of the Fargate CPU one."
  type        = bool
  default     = false
}

variable "gpu_capacity_provider" {
  description = "The capacity provider of GPU container instances (e.g. an Auto Scaling group of g5.xlarge); needed when worker_gpu is true."
  type        = string
  default     = null
}

variable "token_secret_arn" {
  description = "The Secrets Manager secret (a plain string) holding the cluster token; ECS passes it to the head and the workers as TRAINYARD_TOKEN."
  type        = string
}

variable "checkpoint_bucket" {
  description = "The S3 bucket jobs write checkpoints and results to (--storage s3://BUCKET/PREFIX); the task role may read and write it."
  type        = string
}

variable "checkpoint_prefix" {
  description = "The key prefix inside checkpoint_bucket the task role may write, e.g. \"runs/\"; empty for the whole bucket."
  type        = string
  default     = ""
}

variable "client_cidr_blocks" {
  description = "Networks allowed to reach the head's API and dashboard (trainyard submit/status); the tasks reach each other regardless."
  type        = list(string)
  default     = []
}

variable "enable_execute_command" {
  description = "Allow `aws ecs execute-command` into the tasks (to run `trainyard status` in the head, as the seeds run `ray status`)."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the tasks' logs."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}

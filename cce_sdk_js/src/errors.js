// Error types, named like cce_duck.errors.
export class CCEError extends Error {
  constructor(message) { super(message); this.name = this.constructor.name; }
}
export class ValidationError extends CCEError {}
export class NotFoundError extends CCEError {}
export class ConflictError extends CCEError {}
/** A missing or refused API key (HTTP 401 / 403 from the REST server). */
export class AuthError extends CCEError {}
